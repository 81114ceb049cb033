"""Per-call cost of the same extension built two ways: for the running interpreter (full C API)
and as an abi3 wheel (`pyo3/abi3-py311`), side by side (not a test).

Run: `./scripts/bench-abi3.sh` (builds both wheels in release mode and unpacks them into
target/bench-abi3/). The two builds are one module name, so each runs in a worker process of
its own, both alive for the whole run; the workers take turns, one timing (`NUMBER` calls) at a
time, alternating which goes first, so both see the same machine. A repeat is `TIMINGS` pairs
of timings; its ratio is the median of the ratios of the pairs (abi3 / full). The report gives
the median and the worst of `REPEATS` repeats, and a target counts as met only when the worst
repeat meets it.
"""

import json
import os
import statistics
import subprocess
import sys

REPEATS = 3
NUMBER = 500
TIMINGS = 201
TARGET = 1.10
TARGETED = "np.from_dlpack(ours), then dropped"

# (name, setup, statement): what users do with the module.
CALLS = [
    (TARGETED, "t = de.Tensor.arange(64, 64)", "np.from_dlpack(t)"),
    ("our consumer of a NumPy array (pyfunction argument, read)", "a = np.arange(6.0)", "de.total(a)"),
    ("our consumer of a NumPy array (import only)", "a = np.arange(6.0)", "de.consume(a)"),
    ("ours.__dlpack__(max_version=(1, 3)), capsule dropped", "t = de.Tensor.arange(64, 64)",
     "t.__dlpack__(max_version=(1, 3))"),
]

WORKER = r"""
import json, sys, timeit
import numpy as np
import dlpack_example as de
number = int(sys.argv[1])
timers = {}
for name, setup, stmt in json.loads(sys.argv[2]):
    env = {"np": np, "de": de}
    exec(setup, env)
    timers[name] = timeit.Timer(stmt, globals=env)
    timers[name].timeit(number)  # warm-up
print(json.dumps(de.__file__), flush=True)
for line in sys.stdin:
    print(timers[json.loads(line)].timeit(number) / number * 1e9, flush=True)
"""


class Worker:
    def __init__(self, site):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(NUMBER), json.dumps(CALLS)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.file = json.loads(self.process.stdout.readline())

    def time(self, name):
        self.process.stdin.write(json.dumps(name) + "\n")
        self.process.stdin.flush()
        return float(self.process.stdout.readline())

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main():
    full, abi3 = Worker(sys.argv[1]), Worker(sys.argv[2])
    print(f"full: {full.file}\nabi3: {abi3.file}")
    print(f"\n{REPEATS} repeats of {TIMINGS} paired timings of {NUMBER} calls each; ns per call "
          "(median of each repeat, lowest-highest over repeats)")
    print(f"{'call':60} {'full (ns)':>13} {'abi3 (ns)':>13} {'abi3/full median':>17} {'worst':>7}")
    met = True
    for name, _, _ in CALLS:
        ratios, f_times, a_times = [], [], []
        for _ in range(REPEATS):
            pairs = []
            for i in range(TIMINGS):
                if i % 2:
                    a = abi3.time(name)
                    f = full.time(name)
                else:
                    f = full.time(name)
                    a = abi3.time(name)
                pairs.append((f, a))
            f_times.append(statistics.median(f for f, _ in pairs))
            a_times.append(statistics.median(a for _, a in pairs))
            ratios.append(statistics.median(a / f for f, a in pairs))
        worst = max(ratios)
        print(f"{name:60} {min(f_times):6.0f}-{max(f_times):<6.0f} {min(a_times):6.0f}-{max(a_times):<6.0f} "
              f"{statistics.median(ratios):17.3f} {worst:7.3f}")
        if name == TARGETED and worst > TARGET:
            met = False
    full.close()
    abi3.close()
    print(f"\ntarget: {TARGETED} on abi3 within {TARGET:.2f}x of the full build, worst repeat: "
          + ("met" if met else "NOT met"))


if __name__ == "__main__":
    main()
