"""``python -m capsim``: the same command line as ``capsim``."""

from capsim.entry import run

if __name__ == "__main__":
    run()
