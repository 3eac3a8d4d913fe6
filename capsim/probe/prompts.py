"""Prompts of an exact token length that no prefix cache can help with.

Every prompt starts with its own identity (this probe's nonce, then run, level and request)
and a random word list seeded by it, so two prompts share no 16-token block (seed 002's
method: different prompts at every level to defeat the prefix cache). The nonce is new for
every probe: without it a second probe of the same server (or a probe after another tool
sent the same keys) found its prompts' first blocks in the server's prefix cache: a CPU
vLLM server probed twice served three of each 512-token prompt's four 128-token blocks
from the cache, and a 512-token prompt shared its first 256 tokens with the 256-token
prompt of the same key. When the server has vLLM's ``/tokenize``, the
text is tokenised there and cut to exactly the wanted number of token ids, which
``/v1/completions`` accepts as the prompt. Without it, a text of about the right length is
sent and the words-per-token ratio is corrected from each response's usage.
"""

from __future__ import annotations

import random
import secrets

import httpx

from capsim.engine.limits import MAX_ENGINE_COUNT

WORDS = [
    "river",
    "stone",
    "lantern",
    "copper",
    "meadow",
    "signal",
    "harbor",
    "pepper",
    "violet",
    "canyon",
    "ember",
    "walnut",
    "glacier",
    "orbit",
    "pencil",
    "thunder",
    "saddle",
    "marble",
    "quartz",
    "falcon",
    "ribbon",
    "compass",
    "cedar",
    "tundra",
    "velvet",
    "anchor",
    "prism",
    "meadowlark",
    "cobalt",
    "juniper",
    "basalt",
    "sonnet",
    "harvest",
    "lattice",
    "monsoon",
    "beacon",
    "cinder",
    "fjord",
    "garnet",
    "hazel",
    "indigo",
    "jasper",
    "kestrel",
    "lagoon",
    "mosaic",
    "nectar",
    "obsidian",
]


def unique_text(key: str, words: int, nonce: str = "") -> str:
    """``words`` random words after ``[nonce key]``, seeded by both."""
    rng = random.Random(f"{nonce}/{key}")
    body = " ".join(rng.choice(WORDS) for _ in range(max(words, 1)))
    return f"[{nonce} {key}] {body}" if nonce else f"[{key}] {body}"


TOKENIZE_BASE_BYTES = 2**20
TOKENIZE_BYTES_PER_WORD = 64
"""What the probe reads of a /tokenize answer: 1 MiB and 64 bytes a word of the prompt
(a token id is a few digits and a comma, a word one to three tokens)."""

TOKENIZE_SECONDS = 120.0
"""The longest a /tokenize answer may take, whole."""


def _token_list(tokens: object) -> bool:
    """Whether ``tokens`` is a list of token ids (whole numbers from 0)."""
    return isinstance(tokens, list) and all(
        type(t) is int and 0 <= t < MAX_ENGINE_COUNT for t in tokens
    )


class PromptFactory:
    """Builds prompts of a target token length for one server."""

    def __init__(self, url: str, model: str, endpoint: str, nonce: str | None = None):
        """``nonce`` starts every prompt (default: random, new for every factory)."""
        self.nonce = secrets.token_hex(4) if nonce is None else nonce
        self.url = url
        self.model = model
        self.endpoint = endpoint
        self.exact = False
        self.tokens_per_word = 1.3  # corrected from usage when /tokenize is missing

    async def setup(self, client: httpx.AsyncClient) -> bool:
        """Check whether the server tokenises for us (vLLM's /tokenize)."""
        from capsim.probe.client import AnswerTooLarge, fetch_small

        try:
            r = await fetch_small(
                client,
                "POST",
                self.url + "/tokenize",
                TOKENIZE_BASE_BYTES,
                TOKENIZE_SECONDS,
                json={"model": self.model, "prompt": "hello world"},
            )
            answer = r.json() if r.status_code == 200 else None
            self.exact = isinstance(answer, dict) and _token_list(answer.get("tokens"))
        except (httpx.HTTPError, ValueError, TimeoutError, AnswerTooLarge):
            self.exact = False
        return self.exact

    async def _token_ids(self, client: httpx.AsyncClient, text: str) -> list[int]:
        from capsim.errors import CapsimUserError
        from capsim.probe.client import AnswerTooLarge, fetch_small

        words = len(text.split())
        try:
            r = await fetch_small(
                client,
                "POST",
                self.url + "/tokenize",
                TOKENIZE_BASE_BYTES + TOKENIZE_BYTES_PER_WORD * words,
                TOKENIZE_SECONDS,
                json={"model": self.model, "prompt": text, "add_special_tokens": False},
            )
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if isinstance(exc, TimeoutError):
                said = f"no whole answer within {TOKENIZE_SECONDS:g} s"
            raise CapsimUserError(
                f"the server's /tokenize failed on a prompt of {words:,} words ({said})",
                hint="check the server's log; a prompt beyond its context may be refused so",
            ) from None
        try:
            tokens = r.json()["tokens"] if r.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            tokens = None
        if not _token_list(tokens):
            from capsim.probe.client import excerpt

            raise CapsimUserError(
                f"the server's /tokenize did not tokenise a prompt of {len(text.split()):,} "
                f"words (HTTP {r.status_code}: {excerpt(r.text)!r})",
                hint="a prompt beyond the served model's context is refused: lower --input-tokens",
            )
        return tokens

    async def prompt(self, client: httpx.AsyncClient, key: str, tokens: int) -> str | list[int]:
        if self.exact and self.endpoint == "completions":
            words = int(tokens / 0.7) + 8  # generous: cut below
            ids = await self._token_ids(client, unique_text(key, words, self.nonce))
            while len(ids) < tokens:
                before = len(ids)
                words *= 2
                ids = await self._token_ids(client, unique_text(key, words, self.nonce))
                if len(ids) <= before:  # a /tokenize that does not count the prompt
                    from capsim.errors import CapsimUserError

                    raise CapsimUserError(
                        f"the server's /tokenize gave {len(ids):,} tokens for {words:,} "
                        f"words, and {before:,} for half as many: it does not tokenise the "
                        "prompt it is sent",
                        hint="probe with --endpoint chat, or a server whose /tokenize works",
                    )
            return ids[:tokens]
        return unique_text(key, round(tokens / self.tokens_per_word), self.nonce)

    def observe(self, sent_words: int, prompt_tokens: int) -> None:
        """Correct the words-per-token ratio from a response's usage."""
        if sent_words > 0 and prompt_tokens > 0:
            ratio = prompt_tokens / sent_words
            self.tokens_per_word = 0.7 * self.tokens_per_word + 0.3 * ratio
