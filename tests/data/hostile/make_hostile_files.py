"""Writes the hostile input files kept beside it (issue 47): each one no capsim reader may
accept, crash on, hang on or run code from. Run it from this folder to regenerate them;
tests/test_hostile_corpus.py feeds every file to every command that reads a file.
Devices, pipes and folders cannot be kept in git: tests/test_input_files.py makes those."""

import pickle
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Planted:
    """Unpickling this runs a shell command: the pickle cache attack of issue 47."""

    def __reduce__(self):
        import os

        return (os.system, ("touch capsim-pwned",))


LAUGHS = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True)
)

FILES: dict[str, bytes] = {
    "binary.bin": bytes(range(256)) * 8,
    "nul.yaml": b"name: x\n\x00\x00",
    "latin1.yaml": "name: caf\xe9\n".encode("latin-1"),
    "utf16.json": '{"name": "x"}'.encode("utf-16"),
    "laughs.yaml": LAUGHS.encode(),
    "recursive-alias.yaml": b"a: &a [*a, *a]\n",
    "deep.json": b"[" * 20_000 + b"]" * 20_000,
    "deep.yaml": b"a: " + b"[" * 20_000 + b"]" * 20_000 + b"\n",
    "python-tag.yaml": b'- !!python/object/apply:os.system ["touch capsim-pwned"]\n',
    "pickle.pkl": pickle.dumps(Planted()),
    "truncated.json": b'{"name": "x", "scenarios": [{"points": [1, 2',
    "truncated.yaml": b'name: x\nscenarios:\n  - name: "unterminated\n',
    "nan.json": b'{"rows": [{"batch": NaN, "seconds": Infinity}]}',
    "huge-int.yaml": b"x: " + b"9" * 5000 + b"\n",
    "huge-float.yaml": b"x: 1e999\ny: -.inf\n",
    "bad-date.yaml": b"when: 2026-13-45\n",
    "empty.yaml": b"",
    "whitespace.yaml": b"   \n\n\t\n",
    "list.yaml": b"- 1\n- 2\n",
    "scalar.json": b'"just a string"',
    "null.json": b"null",
    "duplicate-keys.yaml": b"a: 1\na: 2\n",
    "multi-document.yaml": b"a: 1\n---\nb: 2\n",
    "control-chars.yaml": b'name: "\x1b[31mred\x1b[0m"\n\x07\n',
    "tab-indent.yaml": b"a:\n\tb: 1\n",
    "long-line.json": b'{"name": "' + b"a" * 200_000 + b'"}',
    "rich-markup.yaml": b"[bold red]name[/]: [/x]\n",
}


def main() -> None:
    for name, content in FILES.items():
        (HERE / name).write_bytes(content)


if __name__ == "__main__":
    main()
