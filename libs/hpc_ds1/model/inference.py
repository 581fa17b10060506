"""Model: built only from the ONNX bytes; one decision is one onnxruntime forward pass."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from hpc_ds1.model import features as ft
from hpc_ds1.model.blend import Blend
from hpc_ds1.model.calibration import Calibration, decision_features
from hpc_ds1.model.guard import distance_reason, hardware_reason, size_reason
from hpc_ds1.model.onnx_graph import (
    CONFIGS,
    DISTANCE,
    INPUT,
    METADATA_KEY,
    PROBABILITIES,
    RUNTIME,
)
from hpc_ds1.model.schema import NO_DISCRIMINATION, Decision, Recommendation, State, Thresholds
from hpc_ds1.model.transfer import (
    LN10,
    Table,
    blended_deltas,
    from_metadata,
    kind_of,
    smoothed,
)
from hpc_ds1.model.transfer import predict as transfer_predict
from hpc_ds1.space import (
    ALL_ACTIONS,
    OVERSUBSCRIPTION,
    STOP,
    Config,
    ConfigSpace,
    action_class,
    neighbours,
    representatives,
)

OUTPUTS = [PROBABILITIES, RUNTIME, DISTANCE]
CACHE_LIMIT = 65536
# The least out-of-fold AUROC (for a decision ending within 5 % of the best available) at
# which the confidence may run a move alone, by default: 0.5 is chance; below 0.6 a confident
# decision is hardly likelier to be right than a doubtful one, so every move waits for an
# engineer (issue 43: "where the model cannot discriminate, it asks the engineer").
MIN_AUROC = Thresholds().min_auroc


class ObservationFailed(RuntimeError):
    """The job did not run successfully, so there is no state to decide about."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


class Model:
    """One machine's model: `decide` (System 2, the next move from a job's state), `recommend`
    (System 1, the whole configuration before anything runs), `observe` (one real run).

    Built from ONNX bytes alone it describes the training machine; `hpc_ds1.load()` also ties it
    to the machine it runs on (`host`: the hardware guard and the configuration space use it) and
    to a home (`observe` queues on its device lock; decisions go to its log)."""

    def __init__(
        self, data: bytes, thresholds: Thresholds | None = None, *, optimize: bool = True
    ) -> None:
        """`optimize`: onnxruntime's full graph optimization (constant folding computes the
        graph's constants at load). Off only where an untrusted file is first tried
        (model.vetting's sandbox): its forward pass then computes them under the caps."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if optimize
            else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        self._session = ort.InferenceSession(
            data, sess_options=options, providers=["CPUExecutionProvider"]
        )
        meta = self._session.get_modelmeta().custom_metadata_map
        if METADATA_KEY not in meta:
            raise ValueError("not an hpc_ds1 model: its ONNX metadata has no 'hpc_ds1' entry")
        self.metadata: dict[str, Any] = json.loads(meta[METADATA_KEY])
        self.version = hashlib.sha256(data).hexdigest()[:16]
        self.thresholds = thresholds or Thresholds()
        self.device_id: str = self.metadata["device_id"]
        self.fingerprint: dict[str, Any] = self.metadata["fingerprint"]
        self.trained_at: str = self.metadata.get("trained_at", "")
        self.name: str = self.metadata.get("name", "hpc_ds1")
        self.metrics: dict[str, Any] = self.metadata.get("metrics", {})
        info = self.metadata["workloads"]
        self.workloads: dict[str, tuple[int, int]] = {
            w: (int(v["range"][0]), int(v["range"][1])) for w, v in info.items()
        }
        self.sizes: dict[str, list[int]] = {w: list(v["sizes"]) for w, v in info.items()}
        self._tiles: dict[str, tuple[int, ...]] = {w: tuple(v["tiles"]) for w, v in info.items()}
        # a file from before the block was a knob has none: the kernels' fixed block (0)
        self._blocks: dict[str, tuple[int, ...]] = {
            w: tuple(v.get("blocks") or (0,)) for w, v in info.items()
        }
        self._machine: list[float] = list(self.metadata["machine"])
        # the columns this file was trained on (a file from before a column was added has fewer)
        self.layout = ft.Layout(self.metadata.get("features"), self.metadata.get("n_base"))
        self._unknown_work: list[float] = list(self.metadata["unknown_work"])
        self.distance_threshold = float(self.metadata["distance_threshold"])
        self._rmse = float(self.metadata.get("runtime_rmse_log10") or 0.3)
        self.blend = Blend(**self.metadata.get("blend", {}))
        # Older model files have neither: no transfer prior, raw confidence.
        transfer = self.metadata.get("transfer") or {}
        self.transfer: Table = from_metadata(transfer.get("table") or {})  # as measured
        # the smoothing training chose (0 and older files: none)
        self.transfer_bandwidth = float(transfer.get("bandwidth") or 0.0)
        self._smoothed: Table = smoothed(self.transfer, self.transfer_bandwidth)
        self._transfer_weight: dict[str, float] = dict(transfer.get("weight") or {})
        self._transfer_rmse: dict[str, float | None] = dict(transfer.get("rmse_log10") or {})
        self._priors: dict[tuple[str, int], tuple[dict[Config, float], float, float | None]] = {}
        self.decide_share = float(transfer.get("decide_share") or 0.0)
        self.calibration = Calibration.from_dict(self.metadata.get("calibration"))
        # issue 43: a confidence that cannot tell the decisions that end >= 5 % above the best
        # from the others runs nothing alone (None: not measured, a single-size setup)
        found = (self.metrics.get("move_model") or {}).get("discrimination") or {}
        self.discrimination_auroc: float | None = found.get("auroc")
        # what a confidence states the chance of (model.calibration.TARGETS); older files: good
        self.calibration_target: str = self.metadata.get("calibration_target") or "good"
        self._aligned: dict[tuple[str, int, ConfigSpace], Any] = {}
        unknown = [c for c in self.metadata["classes"] if c not in ALL_ACTIONS]
        if unknown:
            raise ValueError(
                f"this model file decides moves this version of hpc-ds1 does not know "
                f"({', '.join(unknown)}; it knows {', '.join(ALL_ACTIONS)}): upgrade hpc-ds1, "
                "or train a model with this version (hpc-ds1 setup)"
            )
        self._class_index = np.asarray(
            [ALL_ACTIONS.index(c) for c in self.metadata["classes"]], dtype=int
        )
        self._spaces: dict[tuple[str, int, int], ConfigSpace] = {}
        self._neighbours: dict[tuple[ConfigSpace, Config], dict[str, Config]] = {}
        self._base_rows: dict[tuple[str, int, Config], list[float]] = {}
        self.host: Any = None  # the Fingerprint of the machine this process runs on (bind)
        self.home: Path | None = None
        self._log: Any = None  # a decision_log.DecisionLog (bind)

    def bind(self, host: Any, home: Path | None = None, log: Any = None) -> Model:
        """Tie the model to the machine it runs on and to a home: without an explicit
        `fingerprint`, decisions and recommendations are made for `host` (a model copied from
        another machine is flagged by the hardware guard; the space is the allocation's);
        `observe` holds `home`'s device lock; `log` (a DecisionLog) appends each decision."""
        self.host, self.home, self._log = host, home, log
        return self

    @classmethod
    def from_onnx(cls, data: bytes, thresholds: Thresholds | None = None) -> Model:
        return cls(data, thresholds)

    @classmethod
    def from_untrusted(
        cls, data: bytes, max_bytes: int, thresholds: Thresholds | None = None
    ) -> Model:
        """A model made elsewhere (the model bucket: a device's upload), refused by
        model.vetting's static check (model.vetting.UnsafeModel) before onnxruntime sees it.
        The gateway ran the sandboxed check too before it stored the file; this cheap one
        (tens of ms, once per version a service loads) guards against a bucket written past
        the gateway. The trusted paths (from_onnx, from_file: files this machine trained or
        its user chose) skip it."""
        from hpc_ds1.model.vetting import check_static  # the onnx package, only when loading

        check_static(data, max_bytes)
        return cls(data, thresholds)

    @classmethod
    def from_file(cls, path: str | Path, thresholds: Thresholds | None = None) -> Model:
        return cls(Path(path).read_bytes(), thresholds)

    def describe(self) -> dict[str, Any]:
        """Name, version, where and when it was trained, thresholds, sizes and guard ranges."""
        return {
            "name": self.name,
            "version": self.version,
            "device_id": self.device_id,
            "trained_at": self.trained_at,
            "thresholds": self.thresholds.model_dump(),
            "confidence_means": self.calibration_target,
            "estimators": self.metadata.get("estimators", {}),
            "distance_threshold": self.distance_threshold,
            "workloads": {
                w: {"sizes": self.sizes[w], "guard_range": list(r)}
                for w, r in self.workloads.items()
            },
        }

    # --- features -------------------------------------------------------------------------
    def _machine_for(self, fingerprint: Any) -> list[float]:
        return self._machine if fingerprint is None else ft.machine_vector(fingerprint)

    def _work(self, workload: str, size: int) -> tuple[list[float], bool]:
        w = ft.registry_work(workload, size)
        return (list(w), True) if w is not None else (list(self._unknown_work), False)

    def _tiles_of(self, workload: str) -> tuple[int, ...] | None:
        return self._tiles.get(workload) or ft.registry_tiles(workload)

    def _blocks_of(self, workload: str) -> tuple[tuple[int, ...], int | None]:
        """The blocks decisions move through: the registry's where the workload is registered,
        else the ones the file was trained on."""
        from hpc_ds1.workloads import UnknownWorkload, get_workload

        try:
            wl = get_workload(workload)
            return wl.blocks, wl.default_block
        except UnknownWorkload:
            return self._blocks.get(workload, (0,)), None

    def _knobs_of(self, workload: str) -> tuple[tuple[Any, ...], tuple[str, ...], bool]:
        """The registered workload's own knobs and constraints, and whether it has ranks and
        threads to tune (none, and yes, where it is not registered: its configurations are
        then taken as they come, without moves of its own knobs)."""
        from hpc_ds1.workloads import UnknownWorkload, get_workload

        try:
            wl = get_workload(workload)
        except UnknownWorkload:
            return (), (), True
        return wl.knobs, wl.constraints, wl.ranks_and_threads

    def discriminates(self, floor: float = MIN_AUROC) -> bool:
        """Whether the confidence may run a move alone: its out-of-fold AUROC for ending
        within 5 % of the best is at least `floor` (or was not measured)."""
        return self.discrimination_auroc is None or self.discrimination_auroc >= floor

    def no_discrimination_reason(self, floor: float = MIN_AUROC) -> str:
        return (
            f"{NO_DISCRIMINATION} (out-of-fold AUROC "
            f"{self.discrimination_auroc:.2f} < {floor}): an engineer decides"
        )

    def space_for(self, workload: str, fingerprint: Any = None) -> ConfigSpace:
        """This device's space (the training device's, or `fingerprint`'s) for `workload`."""
        fp = self.fingerprint if fingerprint is None else fingerprint
        info: dict[str, Any] = fp if isinstance(fp, dict) else fp.model_dump()
        # The allocation's CPUs where the fingerprint has them (hpc_ds1.machine.allocation).
        cpus, gpus = int(info.get("usable_cpus") or info["logical_cpus"]), len(info["gpus"])
        key = (workload, cpus, gpus)
        if key not in self._spaces:
            tiles = ft.registry_tiles(workload) or self._tiles.get(workload) or (1,)
            blocks, default_block = self._blocks_of(workload)
            knobs, constraints, machine = self._knobs_of(workload)
            space = ConfigSpace.for_cpus(
                cpus, tiles, gpus, blocks, default_block, knobs, constraints
            )
            if not machine:  # no ranks nor threads to tune: a recorded GPU kernel's
                space = replace(space, ranks=(1,), threads=(1,), max_workers=OVERSUBSCRIPTION)
            self._spaces[key] = space
        return self._spaces[key]

    def state_features(self, state: State, fingerprint: Any = None) -> npt.NDArray[np.float32]:
        work, _ = self._work(state.workload, state.size)
        r = ft.row(
            work,
            state.config,
            self._tiles_of(state.workload),
            self._machine_for(fingerprint),
            state.runtime_s,
            state.throughput,
        )
        return ft.as_matrix([self.layout.state(r)])

    def raw(self, X: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], ...]:
        """The graph's outputs for state rows X (their BASE columns feed the runtime model and
        the guard): probabilities, log10 runtime, distance."""
        X = np.asarray(X, dtype=np.float32)
        feed = {INPUT: X, CONFIGS: np.ascontiguousarray(X[:, : self.layout.n_base])}
        return tuple(np.asarray(o) for o in self._session.run(OUTPUTS, feed))

    def _moves(self, space: ConfigSpace, config: Config) -> dict[str, Config]:
        key = (space, config)
        found = self._neighbours.get(key)
        if found is None:
            if len(self._neighbours) > CACHE_LIMIT:
                self._neighbours.clear()
            found = self._neighbours[key] = neighbours(config, space)
        return found

    def _base_row(self, workload: str, size: int, config: Config) -> list[float]:
        """BASE features on the training machine (cached: decisions repeat)."""
        key = (workload, size, config)
        found = self._base_rows.get(key)
        if found is None:
            if len(self._base_rows) > CACHE_LIMIT:
                self._base_rows.clear()
            work, _ = self._work(workload, size)
            found = self.layout.base(ft.row(work, config, self._tiles_of(workload), self._machine))
            self._base_rows[key] = found
        return found

    def _base(self, workload: str, size: int, config: Config, fingerprint: Any) -> list[float]:
        machine = None if fingerprint is None else ft.machine_vector(fingerprint)
        if machine is None or machine == self._machine:
            return self._base_row(workload, size, config)
        work, _ = self._work(workload, size)
        return self.layout.base(ft.row(work, config, self._tiles_of(workload), machine))

    # --- guard ----------------------------------------------------------------------------
    def _guard(self, workload: str, size: int, fingerprint: Any) -> tuple[list[str], bool]:
        """Reasons from the size range and the hardware; and whether a distance reason would
        only repeat them (unknown workload or other hardware already explain a distance)."""
        reasons = []
        explained = workload not in self.workloads
        reason = size_reason(workload, size, self.workloads)
        if reason:
            reasons.append(reason)
        if fingerprint is not None:
            hw = hardware_reason(self.fingerprint, fingerprint)
            if hw:
                reasons.append(hw)
                explained = True
        return reasons, explained

    # --- System 2: one move ---------------------------------------------------------------
    def decide(
        self,
        state: State,
        *,
        thresholds: Thresholds | None = None,
        space: ConfigSpace | None = None,
        fingerprint: Any = None,
    ) -> Decision:
        """The next move for `state`, in one forward pass. Row 0 is the state; the other rows
        are its feasible neighbours (runtime predictions only)."""
        fingerprint = self.host if fingerprint is None else fingerprint
        reasons, explained = self._guard(state.workload, state.size, fingerprint)
        space = space or self.space_for(state.workload, fingerprint)
        problem = space.problem(state.config)
        if problem:
            reasons.append(f"the configuration is outside this device's space: {problem}")
        moves = self._moves(space, state.config)
        w, s = state.workload, state.size
        base = [self._base(w, s, c, fingerprint) for c in (state.config, *moves.values())]
        x = [*base[0], *ft.telemetry_vector(state.runtime_s, state.throughput)]
        feed = {INPUT: ft.as_matrix([x]), CONFIGS: ft.as_matrix(base)}
        proba, runtime, distance = self._session.run(OUTPUTS, feed)
        far = distance_reason(float(distance[0]), self.distance_threshold)
        if far and not explained:
            reasons.append(far)
        full = np.zeros(len(ALL_ACTIONS))
        full[self._class_index] = proba[0]
        names = [*moves, STOP]
        here = float(runtime[0, 0])
        deltas = self._move_deltas(state, moves, runtime[1:, 0].astype(np.float64) - here)
        # A class of a workload's own knob moves (KNOB_UP ...) gives its probability to the
        # class's move the runtime model ranks best; the class's other moves get none from the
        # classifier (the blend's runtime ranking still weighs them).
        chosen = set(representatives(dict(zip(moves, deltas.tolist(), strict=True))).values())
        p = np.asarray(
            [
                full[ALL_ACTIONS.index(action_class(n))] if n == STOP or n in chosen else 0.0
                for n in names
            ],
            dtype=np.float64,
        )
        total = float(p.sum())
        p = p / total if total > 0 else np.full(len(names), 1.0 / len(names))
        p = self.blend.for_state(p, deltas)
        best = int(np.argmax(p))
        choice = names[best]
        features = decision_features(p, np.append(deltas, np.nan), len(names) - 1)
        confidence = self.calibration.confidence(float(p[best]), choice == STOP, features)
        rules = thresholds or self.thresholds
        mode, why = rules.mode(confidence, reasons)
        if mode == "auto" and not self.discriminates(rules.min_auroc):
            mode, why = "confirm", [self.no_discrimination_reason(rules.min_auroc)]
        runtimes = {m: float(10.0 ** (here + deltas[i])) for i, m in enumerate(moves)}
        runtimes[STOP] = float(10.0**here)
        decision = Decision(
            choice=choice,
            confidence=min(max(confidence, 0.0), 1.0),
            mode=mode,
            reasons=why,
            alternatives={n: float(v) for n, v in zip(names, p, strict=True)},
            model_version=self.version,
            predicted_runtime_s=runtimes[choice],
            predicted_runtimes_s=runtimes,
            distance=float(distance[0]),
            distance_threshold=self.distance_threshold,
        )
        return decision if self._log is None else self._logged(state, decision, fingerprint)

    def _move_deltas(
        self, state: State, moves: dict[str, Config], model_deltas: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Predicted log10(runtime after / now) per move: the runtime model's, with the
        transfer prior blended in at the share of its weight the model file gives decide."""
        prior = self.decide_prior(state.workload, state.size)
        if prior is None:
            return model_deltas
        rel, weight = prior
        targets = list(moves.values())
        return np.asarray(blended_deltas(model_deltas, rel, state.config, targets, weight))

    def decide_prior(self, workload: str, size: int) -> tuple[dict[Config, float], float] | None:
        """The transfer prior decide blends in at `size` (log10 relative runtimes) and its
        weight there (the prior's weight times the file's decide share); None: the runtime
        model alone."""
        prior = self.transfer_prior(workload, size) if self.decide_share > 0 else None
        if prior is None:
            return None
        return prior[0], prior[1] * self.decide_share

    def _logged(self, state: State, decision: Decision, fingerprint: Any) -> Decision:
        """`decision`, appended to the home's log (with its id) when a server runs there."""
        if fingerprint is None:
            device_id = self.device_id
        else:
            device_id = (
                fingerprint["device_id"] if isinstance(fingerprint, dict) else fingerprint.device_id
            )
        event = self._log.event(device_id=device_id, state=state, decision=decision)
        if not self._log.record(event):
            return decision
        return decision.model_copy(update={"decision_id": event.decision_id})

    # --- runtime model / System 1 ---------------------------------------------------------
    def predict_runtimes(
        self, workload: str, size: int, configs: list[Config], fingerprint: Any = None
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Predicted runtimes (s) and distances for `configs`, one batched forward pass."""
        C = ft.as_matrix([self._base(workload, size, c, fingerprint) for c in configs])
        X = np.zeros((1, self.layout.n_state), dtype=np.float32)  # no move model needed here
        _, runtime, distance = self._session.run(OUTPUTS, {INPUT: X, CONFIGS: C})
        return 10.0 ** runtime[:, 0].astype(np.float64), distance.astype(np.float64)

    def predict_runtime(self, workload: str, size: int, config: Config) -> float:
        return float(self.predict_runtimes(workload, size, [config])[0][0])

    def transfer_prior(
        self, workload: str, size: int
    ) -> tuple[dict[Config, float], float, float | None] | None:
        """The trained sizes' relative runtimes at `size` (log10, smoothed across the sizes at
        the file's bandwidth, interpolated in log size),
        the weight leave-one-size-out chose for them and its RMSE; None when the model file
        carries none for `workload` or the weight is 0."""
        key = (workload, size)
        found = self._priors.get(key)
        if found is None:
            sizes = self.transfer.get(workload)
            if not sizes:
                return None
            kind = kind_of(size, sizes)
            weight = float(self._transfer_weight.get(kind, 0.0))
            if weight <= 0.0:
                return None
            rel = transfer_predict(self._smoothed, workload, size)
            if len(self._priors) > CACHE_LIMIT:
                self._priors.clear()
            found = self._priors[key] = (
                {c: v / LN10 for c, v in rel.items()},
                weight,
                self._transfer_rmse.get(kind),
            )
        return found

    @property
    def transfer_weights(self) -> dict[str, float]:
        """The transfer prior's weight inside and outside the trained sizes' range."""
        return dict(self._transfer_weight)

    def reweighted(self, weights: dict[str, float]) -> Model:
        """The same model with other transfer weights (`{"inside": w, "outside": w}`, each in
        [0, 1]): for development comparisons of the weight, sharing the ONNX session."""
        for kind, weight in weights.items():
            if kind not in ("inside", "outside") or not 0.0 <= weight <= 1.0:
                raise ValueError(
                    f"transfer weight {kind}={weight}: accepted are 'inside' and 'outside', "
                    "each between 0 and 1"
                )
        other = copy.copy(self)
        other._transfer_weight = {**self._transfer_weight, **weights}
        other._priors, other._aligned = {}, {}
        return other

    def with_bandwidth(self, bandwidth: float) -> Model:
        """The same model with the transfer table smoothed at another bandwidth (ln size, 0:
        as measured): for development comparisons, sharing the ONNX session."""
        other = copy.copy(self)
        other.transfer_bandwidth = float(bandwidth)
        other._smoothed = smoothed(self.transfer, other.transfer_bandwidth)
        other._priors, other._aligned = {}, {}
        return other

    def with_decide_share(self, share: float) -> Model:
        """The same model with another share of the transfer weight in `decide` (in [0, 1]):
        for development comparisons of the share, sharing the ONNX session."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"decide share {share}: accepted is a number between 0 and 1")
        other = copy.copy(self)
        other.decide_share = float(share)
        return other

    def _aligned_prior(
        self, workload: str, size: int, space: ConfigSpace
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], float, float | None] | None:
        """The prior on `space.configs()`: the indices it knows, its values there centred,
        the weight and RMSE (cached: System 1 asks the same sizes again)."""
        key = (workload, size, space)
        if key in self._aligned:
            return self._aligned[key]
        prior = self.transfer_prior(workload, size)
        found = None
        if prior is not None:
            rel, weight, prior_rmse = prior
            configs = space.configs()
            at = np.asarray([i for i, c in enumerate(configs) if c in rel], dtype=np.intp)
            if len(at) >= 2:
                t = np.asarray([rel[configs[i]] for i in at], dtype=np.float64)
                found = (at, t - t.mean(), weight, prior_rmse)
        if len(self._aligned) > CACHE_LIMIT:
            self._aligned.clear()
        self._aligned[key] = found
        return found

    def recommend(
        self,
        workload: str,
        size: int,
        *,
        thresholds: Thresholds | None = None,
        space: ConfigSpace | None = None,
        fingerprint: Any = None,
    ) -> Recommendation:
        """System 1: every feasible configuration scored in one forward pass, blended with the
        transfer prior the model file carries (the trained sizes' relative runtimes, weighted
        as leave-one-size-out chose); the fastest wins. confidence: the chance it is truly the
        fastest, taking the leave-one-size-out error (of the blend where it applies, else of
        the runtime model) as Gaussian noise in log10 runtime."""
        if size <= 0:
            raise ValueError(f"size must be a positive integer, not {size}")
        fingerprint = self.host if fingerprint is None else fingerprint
        reasons, explained = self._guard(workload, size, fingerprint)
        space = space or self.space_for(workload, fingerprint)
        configs = space.configs()
        if not configs:
            raise ValueError(f"no feasible configuration for {workload} on this device")
        runtimes, distances = self.predict_runtimes(workload, size, configs, fingerprint)
        logs = np.log10(runtimes)
        rmse = self._rmse
        aligned = self._aligned_prior(workload, size, space)
        if aligned is not None:
            at, t, weight, prior_rmse = aligned
            m = logs[at]
            level = float(m.mean())
            logs[at] = level + weight * t + (1.0 - weight) * (m - level)
            runtimes = np.power(10.0, logs)
            rmse = prior_rmse if prior_rmse is not None else rmse
        order = np.argsort(runtimes, kind="stable")
        best = int(order[0])
        far = distance_reason(float(distances[best]), self.distance_threshold)
        if far and not explained:
            reasons.append(far)
        sigma = max(rmse, 1e-6) * math.sqrt(2.0)
        confidence = 1.0
        for i in order[1:]:
            confidence *= _phi(float(logs[i] - logs[best]) / sigma)
        mode, why = (thresholds or self.thresholds).mode(confidence, reasons)
        return Recommendation(
            workload=workload,
            size=size,
            config=configs[best],
            predicted_runtime_s=float(runtimes[best]),
            confidence=min(max(confidence, 0.0), 1.0),
            mode=mode,
            reasons=why,
            alternatives={configs[i].label(): float(runtimes[i]) for i in order},
            model_version=self.version,
        )

    # --- a real run -----------------------------------------------------------------------
    def observe(
        self,
        workload: str,
        size: int,
        config: dict[str, Any] | Config,
        *,
        repeats: int | None = None,
    ) -> State:
        """Run the job once for real on this machine and return the state with telemetry.
        `tile` defaults to the workload's default; the configuration may be the user's own,
        oversubscribed one (the runnable space), so a decision can lead back from it.
        `repeats` (None: the workload's own, else 3) and the run's timeout (the workload's
        own, else the runner's default) come from the workload's file when it declares them."""
        from hpc_ds1.machine.devicelock import device_lock
        from hpc_ds1.runner import run
        from hpc_ds1.settings import Settings
        from hpc_ds1.space import ConfigSpace
        from hpc_ds1.workloads import get_workload

        if isinstance(config, Config):
            cfg = config
        else:
            values = dict(config)
            values.setdefault("tile", get_workload(workload).default_tile)
            values.setdefault("block", get_workload(workload).default_block)
            cfg = State.model_validate(
                {"workload": workload, "size": size, "config": values}
            ).config
        space = ConfigSpace.for_device(workload=workload).runnable()
        with device_lock(self.home or Settings().home):
            result = run(workload, size, cfg, repeats=repeats, space=space)
        if not result.ok or result.runtime_s is None:
            raise ObservationFailed(
                f"{workload} size {size} {cfg.label()} did not run successfully: "
                f"{result.status.value} {result.error}".strip(),
                result,
            )
        return State(
            workload=workload,
            size=size,
            config=cfg,
            runtime_s=max(result.runtime_s, 1e-12),
            throughput=result.throughput,
        )
