"""The top frames of a py-spy flame graph (SVG), as docs/performance.md quotes them.

Run: `python benchmarks/flame_top.py PROFILE.svg [--process NAME] [--top N]`. Prints the share
of samples of each process (`hpc-ds1 service NAME` shows as NAME) and the frames with the most
self samples (time spent in the frame itself, not in what it calls), with their process.
The SVG is the one `bench_decide_http.py --profile` or `bench_eventlog.py --profile` writes."""

from __future__ import annotations

import argparse
import html
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(
    r'<g><title>(?P<title>.*?)</title><rect x="[^"]*" y="(?P<y>[\d.]+)"[^>]*'
    r'fg:x="(?P<x>\d+)" fg:w="(?P<w>\d+)"',
    re.S,
)
_SAMPLES = re.compile(r" \([\d,]+ samples?, [\d.]+%\)$")
_SERVICE = re.compile(r'service (\w+)"$')
ROW_HEIGHT = 16  # inferno draws one frame per 16 px


@dataclass(frozen=True)
class Frame:
    depth: int
    x: int
    width: int
    name: str


def frames_of(svg: str) -> list[Frame]:
    raw = [
        (float(m["y"]), int(m["x"]), int(m["w"]), _SAMPLES.sub("", html.unescape(m["title"])))
        for m in _FRAME.finditer(svg)
    ]
    if not raw:
        raise SystemExit("no frames: is this a py-spy flame graph SVG?")
    root_y = max(raw, key=lambda f: f[2])[0]  # the widest frame is the root ("all")
    below = root_y == max(y for y, *_ in raw)  # inferno draws the root at the bottom
    return [
        Frame(round(abs(y - root_y) / ROW_HEIGHT), x, w, name)
        for y, x, w, name in raw
        if (y <= root_y) == below or y == root_y
    ]


_SERVICE_CODE = re.compile(r"services/(\w+)/")


def _service_in(process: Frame, by_depth: dict[int, list[Frame]]) -> str | None:
    """The service a forked process runs (its title is only `hpc-ds1 serve`): the one whose
    code (services/NAME/) has the most samples under it; None for `serve` itself."""
    inside = [
        f
        for depth, frames in by_depth.items()
        if depth > process.depth
        for f in frames
        if process.x <= f.x < process.x + process.width
    ]
    # py-spy draws a child process under its parent's frame: its samples are not the parent's.
    children = [(f.x, f.x + f.width) for f in inside if f.name.startswith("process ")]
    seen: Counter[str] = Counter()
    for f in inside:
        found = _SERVICE_CODE.search(f.name)
        if found and not any(a <= f.x < b for a, b in children):
            seen[found.group(1)] += f.width
    if not seen:
        return "serve" if "serve" in process.name else None
    return seen.most_common(1)[0][0]


def summarize(frames: list[Frame]) -> tuple[int, Counter[str], Counter[tuple[str, str]]]:
    """(total samples, samples per process, self samples per (process, frame))."""
    by_depth: dict[int, list[Frame]] = defaultdict(list)
    for frame in frames:
        by_depth[frame.depth].append(frame)
    total = max(f.width for f in by_depth[0])
    processes: Counter[str] = Counter()
    selfs: Counter[tuple[str, str]] = Counter()
    stack: list[tuple[Frame, str]] = [(f, "") for f in by_depth[0]]
    while stack:
        frame, process = stack.pop()
        service = _SERVICE.search(frame.name)
        if frame.name.startswith("process "):
            if process:  # nested in its parent's frame: not the parent's samples
                processes[process] -= frame.width
            process = _service_in(frame, by_depth) or frame.name.split(":")[0]
            if not service:
                processes[process] += frame.width
        if service and process:
            processes[process] -= frame.width if not process.startswith("serve") else 0
            process = service.group(1)
            processes[process] += frame.width
        children = [c for c in by_depth[frame.depth + 1] if frame.x <= c.x < frame.x + frame.width]
        own = frame.width - sum(c.width for c in children)
        if own > 0:
            selfs[(process or "-", frame.name)] += own
        stack += [(c, process) for c in children]
    return total, processes, selfs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("svg", type=Path)
    parser.add_argument("--process", help="only the frames of this process (e.g. gateway)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    total, processes, selfs = summarize(frames_of(args.svg.read_text()))
    print(f"{total} samples")
    for name, samples in processes.most_common():
        if samples > 0:
            print(f"  {100 * samples / total:5.1f}%  process {name}")
    print("self samples, top frames:")
    shown = 0
    for (process, name), samples in selfs.most_common():
        if args.process and process != args.process:
            continue
        print(f"  {100 * samples / total:5.2f}%  [{process}] {' '.join(name.split())[:110]}")
        shown += 1
        if shown == args.top:
            break


if __name__ == "__main__":
    main()
