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


def test_importing_the_package_leaves_the_programs_logging_to_it(tmp_path):
    """Importing fairseq sets the root logger to DEBUG with a handler
    (fairseq's wav2vec2_classification calls ``logging.basicConfig`` at
    import): after ``import fairseq_hybrid`` a program's root logger is as
    Python leaves it, no library's debug line is printed, and the program's
    own ``logging.basicConfig`` takes effect; a program that configured
    logging before keeps its configuration."""
    fresh = (
        "import logging\n"
        "import fairseq_hybrid\n"
        "root = logging.getLogger()\n"
        "print(root.level, len(root.handlers))\n"
        "logging.getLogger('some.library').debug('a debug line of a library')\n"
        "logging.basicConfig(level=logging.INFO, format='mine: %(message)s')\n"
        "logging.getLogger('program').info('its own line')\n"
    )
    result = subprocess.run([sys.executable, "-c", fresh], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["30", "0"]  # WARNING, no handler: Python's defaults
    assert "a debug line of a library" not in result.stderr and "mine: its own line" in result.stderr
    configured = (
        "import logging\n"
        "logging.basicConfig(level=logging.DEBUG, format='before: %(message)s')\n"
        "import fairseq_hybrid\n"
        "logging.getLogger('some.library').debug('still shown')\n"
    )
    result = subprocess.run([sys.executable, "-c", configured], cwd=tmp_path, capture_output=True, text=True,
                            check=True)
    assert "before: still shown" in result.stderr


def test_the_plans_default_host_cost_ships_with_the_package():
    """fairseq-hybrid-plan's default host cost is package data, not a file
    of the checkout's docs/ (which an installed package lacks); it is the
    measurement docs/bench/host_cost.json records, byte for byte."""
    import fairseq_hybrid
    from fairseq_hybrid.commands import plan

    package = os.path.dirname(os.path.abspath(fairseq_hybrid.__file__))
    assert os.path.commonpath([plan.HOST_COST, package]) == package
    assert plan.build_parser().parse_args([]).host_cost == plan.HOST_COST
    kept = os.path.join(REPO, "docs", "bench", "host_cost.json")
    with open(plan.HOST_COST, "rb") as shipped, open(kept, "rb") as record:
        assert shipped.read() == record.read()
    assert "forecasts/*.json" in open(os.path.join(REPO, "pyproject.toml")).read()
