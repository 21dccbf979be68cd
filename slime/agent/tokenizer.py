"""The tokenizer interface the agent tier needs, and a byte-level implementation of it.

The adapter only ever needs encode/decode and the ids of a few special tokens,
so any tokenizer with those (an HF tokenizer wrapped in three lines) fits.
`ByteTokenizer` is complete and deterministic: every UTF-8 byte is one token
and the chat-template markers are single special tokens. It needs no download,
which is why the CPU tier uses it.
"""

from __future__ import annotations

import re
from typing import Protocol

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"


class Tokenizer(Protocol):
    """What the adapter needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str: ...

    def token_id(self, token: str) -> int: ...

    @property
    def eos_ids(self) -> frozenset[int]: ...


class ByteTokenizer:
    """One token per UTF-8 byte (ids 0-255), plus the chat-template specials."""

    def __init__(self) -> None:
        self._special = {END_OF_TEXT: 256, IM_START: 257, IM_END: 258}
        self._special_by_id = {v: k for k, v in self._special.items()}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in self._special) + ")")

    @property
    def vocab_size(self) -> int:
        """Number of ids this tokenizer can produce."""
        return 256 + len(self._special)

    @property
    def eos_ids(self) -> frozenset[int]:
        """Ids that end a generated turn."""
        return frozenset({self._special[IM_END], self._special[END_OF_TEXT]})

    def token_id(self, token: str) -> int:
        """Id of one special token."""
        return self._special[token]

    def encode(self, text: str) -> list[int]:
        """Text to ids; special-token strings become their single id."""
        ids: list[int] = []
        for part in self._split.split(text):
            if part in self._special:
                ids.append(self._special[part])
            elif part:
                ids.extend(part.encode("utf-8"))
        return ids

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        """Ids to text; an incomplete UTF-8 tail decodes to U+FFFD rather than raising."""
        out: list[str] = []
        run = bytearray()
        for i in ids:
            if i in self._special_by_id:
                out.append(run.decode("utf-8", errors="replace"))
                run.clear()
                if not skip_special:
                    out.append(self._special_by_id[i])
            elif 0 <= i < 256:
                run.append(i)
            else:
                raise ValueError(f"token id {i} is outside this tokenizer's vocabulary")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)
