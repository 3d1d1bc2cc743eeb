"""A measuring script's child that starts children of its own (a recipe's
bash and its fairseq-train) ends with everything it started, however the
script ends (harness.child_groups): bleu_parity.py, bench_translate.py and
the GPU check run their recipes and phases that way."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import assert_children_end_with, descendants
from fairseq_hybrid.harness.child_groups import run_in_group

# a script whose child (bash) starts two grandchildren and waits for them
SCRIPT = """
import signal
# Ctrl-C as a terminal gives it: a shell that ran this suite in the background leaves SIGINT ignored,
# and Python then installs no KeyboardInterrupt of its own
signal.signal(signal.SIGINT, signal.default_int_handler)
from fairseq_hybrid.harness.child_groups import group_of_its_own
with group_of_its_own(["bash", "-c", "sleep 300 & sleep 300 & wait"]) as process:
    process.wait()
"""


def both_sleeps(seen: dict) -> bool:
    return sum(command.strip() == "sleep 300" for command in seen.values()) == 2


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_what_the_child_started_ends_with_the_script(how):
    script = subprocess.Popen([sys.executable, "-c", SCRIPT])
    seen = assert_children_end_with(script, how, running=0.0, what="what the script's child started",
                                    among=descendants, ready=both_sleeps)
    commands = sorted(command.split()[0].rsplit("/", 1)[-1] for command in seen.values())
    assert commands == ["bash", "python", "sleep", "sleep"], seen  # python: the keeper


def test_run_in_group_gives_the_status_and_output_and_ends_the_group_on_a_timeout():
    done = run_in_group(["bash", "-c", "cat; exit 3"], input=b"line\n", stdout=subprocess.PIPE)
    assert (done.returncode, done.stdout) == (3, b"line\n")
    start = time.time()
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group(["bash", "-c", "sleep 300 & echo $! > /dev/stderr; wait"], stderr=subprocess.DEVNULL, timeout=1)
    assert time.time() - start < 10
    assert not [command for command in (descendants(os.getpid())).values() if "sleep 300" in command]
