"""``python -m capsim``: the same command line as ``capsim``."""

from capsim.cli.main import run

if __name__ == "__main__":
    run()
