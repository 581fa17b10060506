from __future__ import annotations

import pytest

from hpc_ds1.space import (
    ALL_ACTIONS,
    MOVES,
    STOP,
    Config,
    ConfigSpace,
    InfeasibleConfig,
    apply_move,
    neighbours,
)

TILES = (32, 64, 128, 256)


def space(cpus: int = 2, gpus: int = 0) -> ConfigSpace:
    return ConfigSpace.for_cpus(cpus, TILES, gpus=gpus)


def test_two_core_machine_has_ranks_1_2_4_and_threads_1_2() -> None:
    s = space()
    assert s.ranks == (1, 2, 4)
    assert s.threads == (1, 2)
    assert not s.has_gpu
    configs = s.configs()
    assert {(c.ranks, c.threads) for c in configs} == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)}
    assert len(configs) == 5 * len(TILES)
    assert all(not c.gpu for c in configs)


def test_this_device_space_comes_from_its_fingerprint() -> None:
    s = ConfigSpace.for_device(workload="gemm")
    assert 1 in s.ranks and s.tiles == TILES
    assert s.default().tile == 128
    assert s.contains(s.default())


def test_moves_and_stop() -> None:
    # the move model's classes: every move, STOP, then the classes of a workload's own knobs'
    # moves (appended, so a model file's class indices from before them keep their meaning)
    assert STOP not in MOVES and ALL_ACTIONS == (*MOVES, STOP, "KNOB_UP", "KNOB_DOWN", "KNOB_SET")
    assert set(MOVES) == {
        "RANKS_UP", "RANKS_DOWN", "THREADS_UP", "THREADS_DOWN",
        "TILE_UP", "TILE_DOWN", "USE_GPU", "USE_CPU",
        "RANKS_UP_THREADS_DOWN", "RANKS_DOWN_THREADS_UP", "BLOCK_UP", "BLOCK_DOWN",
    }  # fmt: skip


def test_a_space_without_block_is_the_space_before_the_knob() -> None:
    s = space()
    assert s.blocks == (0,) and s.default_block == 0
    assert all(c.block == 0 for c in s.configs())
    assert "BLOCK_UP" not in neighbours(Config(ranks=1, threads=1, tile=64), s)
    assert s.problem(Config(ranks=1, threads=1, tile=64, block=64)) == (
        "block=64 is not accepted: this workload's kernel has no block"
    )
    # a configuration recorded before the knob (no block field) is the same configuration
    assert Config.model_validate({"ranks": 1, "threads": 2, "tile": 64}) == Config(
        ranks=1, threads=2, tile=64, block=0
    )
    assert Config(ranks=1, threads=2, tile=64).label() == "ranks=1 threads=2 tile=64 gpu=False"


def test_block_is_a_dimension_with_its_moves() -> None:
    s = ConfigSpace.for_cpus(2, TILES, blocks=(16, 64, 256), default_block=64)
    assert len(s.configs()) == 5 * len(TILES) * 3
    assert s.default().block == 64
    c = Config(ranks=2, threads=1, tile=64, block=64)
    got = neighbours(c, s)
    assert got["BLOCK_UP"] == c.model_copy(update={"block": 256})
    assert got["BLOCK_DOWN"] == c.model_copy(update={"block": 16})
    assert "BLOCK_UP" not in neighbours(c.model_copy(update={"block": 256}), s)
    assert s.problem(c.model_copy(update={"block": 32})) == (
        "block=32 is not accepted; block must be one of [16, 64, 256]"
    )
    assert c.label() == "ranks=2 threads=1 tile=64 block=64 gpu=False"
    # the runnable space takes block 0 (how a job ran before the knob) and moves back from it
    wide = s.runnable()
    legacy = Config(ranks=1, threads=2, tile=64)
    assert wide.contains(legacy) and not s.contains(legacy)
    assert apply_move(legacy, "BLOCK_UP", wide) == legacy.model_copy(update={"block": 16})


def test_registered_blocked_workloads_have_their_block_in_the_space() -> None:
    from hpc_ds1.workloads import get_workload

    wl = get_workload("stencil")
    s = ConfigSpace.for_device(workload="stencil")
    assert wl.has_block and s.blocks == wl.blocks == (0, 2, 4) and s.default().block == 0
    for name in ("gemm", "nbody", "montecarlo"):
        assert ConfigSpace.for_device(workload=name).blocks == (0,)


def test_neighbours_one_change_each_and_only_feasible() -> None:
    s = space()
    c = Config(ranks=2, threads=1, tile=64)
    got = neighbours(c, s)
    assert got == {
        "RANKS_UP": Config(ranks=4, threads=1, tile=64),
        "RANKS_DOWN": Config(ranks=1, threads=1, tile=64),
        "THREADS_UP": Config(ranks=2, threads=2, tile=64),
        "TILE_UP": Config(ranks=2, threads=1, tile=128),
        "TILE_DOWN": Config(ranks=2, threads=1, tile=32),
        "RANKS_DOWN_THREADS_UP": Config(ranks=1, threads=2, tile=64),
    }
    # ranks=4 x threads=2 would oversubscribe beyond 2x the cores: not a neighbour
    assert "THREADS_UP" not in neighbours(Config(ranks=4, threads=1, tile=64), s)
    assert "TILE_UP" not in neighbours(Config(ranks=1, threads=1, tile=256), s)


def test_configurations_and_neighbours_worked_out_once_are_each_callers_own() -> None:
    """They are cached per space (training replays ask hundreds of thousands of times): what
    one caller does to its list or dict must not reach the next caller."""
    s = space()
    first = s.configs()
    first.clear()
    assert s.configs() == space().configs() and len(s.configs()) > 0
    c = Config(ranks=2, threads=1, tile=64)
    got = neighbours(c, s)
    got.pop("TILE_UP")
    assert neighbours(c, s)["TILE_UP"] == Config(ranks=2, threads=1, tile=128)
    # a different space is a different key: 4 CPUs allow threads=4
    assert len(space(cpus=4).configs()) > len(s.configs())
    # a space built by hand with lists (not hashable) is worked out each time, not refused
    listed = ConfigSpace(ranks=[1, 2], threads=[1, 2], tiles=[64], max_workers=4)  # type: ignore[arg-type]
    assert len(listed.configs()) == 4 and "RANKS_UP" in neighbours(
        Config(ranks=1, threads=1, tile=64), listed
    )


def test_a_trade_keeps_ranks_times_threads() -> None:
    s = space()
    pairs = {}
    for c in s.configs():
        for move in ("RANKS_UP_THREADS_DOWN", "RANKS_DOWN_THREADS_UP"):
            nxt = apply_move(c, move, s)
            if nxt is not None:
                assert nxt.ranks * nxt.threads == c.ranks * c.threads and nxt.tile == c.tile
                pairs[(c.ranks, c.threads), move] = (nxt.ranks, nxt.threads)
    assert pairs == {
        ((1, 2), "RANKS_UP_THREADS_DOWN"): (2, 1),
        ((2, 1), "RANKS_DOWN_THREADS_UP"): (1, 2),
        ((2, 2), "RANKS_UP_THREADS_DOWN"): (4, 1),
        ((4, 1), "RANKS_DOWN_THREADS_UP"): (2, 2),
    }
    # one worker cannot be split; a configuration outside the space has no trade
    assert "RANKS_UP_THREADS_DOWN" not in neighbours(Config(ranks=1, threads=1, tile=64), s)
    assert apply_move(Config(ranks=8, threads=1, tile=64), "RANKS_DOWN_THREADS_UP", s) is None


def test_gpu_moves_only_where_there_is_a_gpu() -> None:
    c = Config(ranks=1, threads=2, tile=64)
    assert "USE_GPU" not in neighbours(c, space())
    with_gpu = space(gpus=1)
    assert neighbours(c, with_gpu)["USE_GPU"] == c.model_copy(update={"gpu": True})
    g = c.model_copy(update={"gpu": True})
    moves = neighbours(g, with_gpu)
    assert moves["USE_CPU"] == c and "RANKS_UP" not in moves
    assert apply_move(c, "USE_CPU", with_gpu) is None


def test_gpu_configurations_carry_one_tile_and_block() -> None:
    """The GPU kernels launch fixed shapes: a tile or block on them would run the same job
    again, so each (ranks, threads) has one GPU configuration and USE_GPU takes the GPU's own
    tile and block from wherever it starts."""
    blocked = ConfigSpace.for_cpus(4, TILES, gpus=1, blocks=(2, 4, 8), default_block=4)
    gpu_configs = [c for c in blocked.configs() if c.gpu]
    assert {(c.tile, c.block) for c in gpu_configs} == {(blocked.gpu_tile, 2)}
    assert len(gpu_configs) == len({(c.ranks, c.threads) for c in gpu_configs})
    start = Config(ranks=1, threads=2, tile=256, block=8)
    assert apply_move(start, "USE_GPU", blocked) == Config(
        ranks=1, threads=2, tile=blocked.gpu_tile, block=2, gpu=True
    )
    assert "TILE_UP" not in neighbours(apply_move(start, "USE_GPU", blocked), blocked)
    with pytest.raises(InfeasibleConfig, match="which has no tile: tile must be 64"):
        blocked.validate(Config(ranks=1, threads=1, tile=128, block=2, gpu=True))


def test_unknown_move_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown move"):
        apply_move(Config(ranks=1, threads=1, tile=64), "JUMP", space())


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (Config(ranks=3, threads=1, tile=64), r"ranks=3 is not accepted; .*\[1, 2, 4\]"),
        (Config(ranks=1, threads=4, tile=64), r"threads=4 is not accepted; .*\[1, 2\]"),
        (Config(ranks=1, threads=1, tile=48), r"tile=48 is not accepted; .*\[32, 64, 128, 256\]"),
        (Config(ranks=4, threads=2, tile=64), r"ranks x threads = 8 exceeds 4"),
        (Config(ranks=1, threads=1, tile=64, gpu=True), r"no CUDA GPU"),
    ],
)
def test_infeasible_configs_say_what_is_wrong(config: Config, message: str) -> None:
    s = space()
    assert not s.contains(config)
    with pytest.raises(InfeasibleConfig, match=message):
        s.validate(config)


def test_config_rejects_nonpositive_values() -> None:
    with pytest.raises(ValueError):
        Config(ranks=0, threads=1, tile=1)


def test_a_configuration_with_own_knobs_is_recorded_as_a_table_and_one_without_as_before() -> None:
    plain = Config(ranks=2, threads=1, tile=64)
    assert plain.model_dump() == {"ranks": 2, "threads": 1, "tile": 64, "gpu": False}
    assert plain.label() == "ranks=2 threads=1 tile=64 gpu=False"
    own = Config(ranks=2, threads=1, tile=1, knobs={"q": 2, "algo": "fast", "pad": True})
    assert own.model_dump()["knobs"] == {"algo": "fast", "pad": True, "q": 2}
    assert own.label() == "ranks=2 threads=1 tile=1 algo=fast pad=True q=2 gpu=False"
    assert Config.model_validate_json(own.model_dump_json()) == own
    assert own.knob("q") == 2 and own.knob("nb") is None
    assert hash(own) == hash(Config.model_validate(own.model_dump()))
    with pytest.raises(ValueError, match="names a knob twice"):
        Config(ranks=1, threads=1, tile=1, knobs=[("a", 1), ("a", 2)])


def test_measurement_keys_tell_own_knobs_apart_and_stay_subject_safe() -> None:
    from hpc_ds1.measure import config_key

    assert config_key(Config(ranks=2, threads=1, tile=64)) == "r2-t1-k64-cpu"
    a = config_key(Config(ranks=1, threads=1, tile=1, knobs={"nb": 8, "v": "1.5"}))
    b = config_key(Config(ranks=1, threads=1, tile=1, knobs={"nb": 16, "v": "1.5"}))
    assert a != b and a.startswith("r1-t1-k1-cpu-o") and "." not in a + b


def test_a_job_line_carries_own_knobs_to_the_ranks() -> None:
    from hpc_ds1.knobs import Knob
    from hpc_ds1.runner.jobspec import JobSpec, knob_values

    spec = JobSpec("app", 64, 1, 1, 2, knobs=(("nb", "16"), ("pad", "true"), ("v", "1.5")))
    back = JobSpec.decode(spec.encode())
    assert back == spec
    knobs = (
        Knob("nb", "int", (8, 16), 8),
        Knob("pad", "bool", (False, True), False),
        Knob("v", "ordered", (1.0, 1.5), 1.0),
    )
    assert knob_values(back, knobs) == {"nb": 16, "pad": True, "v": 1.5}
    with pytest.raises(ValueError, match=r"knob nb='32' is not one of \[8, 16\]"):
        knob_values(JobSpec("app", 64, 1, 1, 2, knobs=(("nb", "32"),)), knobs[:1])


@pytest.mark.parametrize(("cpus", "gpus"), [(2, 0), (96, 0), (8, 2)])
@pytest.mark.parametrize("name", ["gemm", "stencil", "nbody", "montecarlo"])
def test_a_space_as_knobs_has_exactly_its_configurations(name: str, cpus: int, gpus: int) -> None:
    """knob_view: the searches over any knobs (hpc_ds1.tuning.search) walk the built-ins'
    spaces too; the view must neither add nor lose a configuration, GPU rules included."""
    from dataclasses import replace

    from hpc_ds1.space import knob_view
    from hpc_ds1.workloads import get_workload

    wl = get_workload(name)
    space = ConfigSpace.for_cpus(
        cpus, wl.tiles, gpus if wl.gpu_capable else 0, wl.blocks, wl.default_block
    )
    space = replace(space, default_tile=wl.default_tile)
    view = knob_view(space)
    configs = set(space.configs())
    assert {view.config(v) for v in view.knobs.configs()} == configs
    assert all(view.config(view.values(c)) == c for c in configs)
