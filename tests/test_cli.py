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


def test_demo_batch_size_names(capsys):
    """--batch-size grow: the growing schedule; the default: full batches on the demo's data."""
    assert main(["demo", "--batch-size", "grow"]) == 0
    assert "B = 32 (rounds 1-10)" in capsys.readouterr().out
    assert main(["demo"]) == 0
    assert "B = full (rounds 1-" in capsys.readouterr().out


def test_module_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "ssca_solver", "demo", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--alpha" in out and "--rounds" in out


def test_network_command_on_digits(capsys):
    assert main(["network", "--rounds", "20", "--hidden", "8"]) == 0
    out, _ = capsys.readouterr()
    assert "closed_form" in out and "test accuracy" in out


def test_network_command_constrained(capsys):
    assert main(["network", "--rounds", "20", "--hidden", "8", "--U", "0.6"]) == 0
    out, _ = capsys.readouterr()
    assert "Algorithm 2" in out and "cross-entropy <= 0.6" in out


def test_mnist_without_files_says_how_to_get_them(capsys, tmp_path):
    assert main(["network", "--data", "mnist"]) == 2
    assert "--data-dir" in capsys.readouterr().err
    assert main(["network", "--data", "fashion-mnist", "--data-dir", str(tmp_path)]) == 2
    assert "dataset-fashion-mnist" in capsys.readouterr().err


def test_the_cli_leaves_the_callers_print_options_alone():
    """main() in a process (a test, a notebook) printed arrays at precision 4 afterwards: a
    docs example after test_cli printed [0.1315] where its page shows [0.13152294]."""
    import numpy as np

    from ssca_solver import cli

    before = np.get_printoptions()
    cli.main(["demo", "--rounds", "5"])
    assert np.get_printoptions() == before
