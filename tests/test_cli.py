import subprocess
import sys

from ssca_solver.cli import main


def test_demo_prints_the_report(capsys):
    assert main(["demo", "--rounds", "150", "--batch-size", "20"]) == 0
    out, err = capsys.readouterr()
    for section in ("Neyman-Pearson", "penalty steps", "constraints", "KKT", "communication",
                    "reference", "relative objective gap"):
        assert section in out
    assert "[ssca] round" in err  # progress goes to stderr


def test_module_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "ssca_solver", "demo", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--alpha" in out and "--rounds" in out
