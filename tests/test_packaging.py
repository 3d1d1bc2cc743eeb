"""fairseq_hybrid works as an installed package, from any working directory."""

import os
import subprocess
import sys

from conftest import REPO


def test_installed_package_registers_everything_from_anywhere(tmp_path):
    code = (
        "import fairseq_hybrid\n"
        "from fairseq.models import ARCH_MODEL_REGISTRY\n"
        "from fairseq.criterions import CRITERION_REGISTRY\n"
        "print(sorted(a for a in ARCH_MODEL_REGISTRY if a.startswith('hybrid_lstm')))\n"
        "print('hybrid_cross_entropy' in CRITERION_REGISTRY)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split("\n")
    assert lines[0] == "['hybrid_lstm', 'hybrid_lstm_base', 'hybrid_lstm_paper', 'hybrid_lstm_tiny']"
    assert lines[1] == "True"


def test_module_prints_the_user_dir(tmp_path):
    result = subprocess.run([sys.executable, "-m", "fairseq_hybrid"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == os.path.join(REPO, "fairseq_hybrid")
