"""CPU time of a served target's process tree, and waiting for served targets to go quiet."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from embedserve.bench.cputime import CpuTime, wait_quiet

# spins on one core for SPIN_S, then sleeps: a served peer's threads after its own last request
SPIN_S = 1.5
_SPIN_THEN_SLEEP = f"import time\nend = time.time() + {SPIN_S}\nwhile time.time() < end: pass\ntime.sleep(60)"


def test_waits_while_a_served_process_spins_and_not_once_it_is_quiet() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _SPIN_THEN_SLEEP])
    try:
        time.sleep(0.2)  # started and spinning
        waited = wait_quiet([proc.pid], most_s=20)
        assert 0.8 < waited < 15, waited  # until the spin ended (not the 20 s cap)
        with CpuTime("remote", proc.pid) as quiet:
            assert wait_quiet([proc.pid], most_s=20) < 2  # quiet now: one window
        assert quiet.seconds is not None and quiet.seconds < 0.2
    finally:
        proc.kill()
        proc.wait()


def test_gone_or_no_processes_are_quiet_and_the_cap_holds() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not psutil.pid_exists(proc.pid)  # reaped
    assert wait_quiet([proc.pid], most_s=5) < 2
    assert wait_quiet([], most_s=5) < 0.01
    spinner = subprocess.Popen([sys.executable, "-c", _SPIN_THEN_SLEEP.replace(str(SPIN_S), "30")])
    try:
        time.sleep(0.2)
        assert wait_quiet([spinner.pid], most_s=1.0) < 2  # gives up at the cap, however busy
    finally:
        spinner.kill()
        spinner.wait()
