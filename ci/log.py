"""The one module that knows GitHub Actions output syntax (groups, annotations, step summary)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


def in_actions(env: Mapping[str, str] | None = None) -> bool:
    return (env if env is not None else os.environ).get("GITHUB_ACTIONS") == "true"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


# One line is one write, under one lock: entries running at once print from their own
# threads, and `print` writes the text and its newline separately, so two lines could merge.
_WRITE = threading.Lock()


class Log:
    """Writes progress for a human, and Actions commands when running in Actions."""

    def __init__(self, *, actions: bool, stream: TextIO | None = None,
                 summary_path: str | None = None, output_path: str | None = None) -> None:
        self.actions = actions
        self.stream = stream if stream is not None else sys.stdout
        self.summary_path = summary_path
        self.output_path = output_path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, stream: TextIO | None = None) -> Log:
        env = env if env is not None else os.environ
        return cls(actions=in_actions(env), stream=stream,
                   summary_path=env.get("GITHUB_STEP_SUMMARY") or None,
                   output_path=env.get("GITHUB_OUTPUT") or None)

    def line(self, text: str = "") -> None:
        with _WRITE:
            self.stream.write(f"{text}\n")
            self.stream.flush()

    @contextmanager
    def group(self, title: str) -> Iterator[None]:
        if self.actions:
            self.line(f"::group::{_escape_data(title)}")
        else:
            self.line(f"--- {title}")
        try:
            yield
        finally:
            if self.actions:
                self.line("::endgroup::")

    def error(self, message: str, *, file: str | None = None, title: str | None = None) -> None:
        if self.actions:
            props = []
            if file:
                props.append(f"file={_escape_property(file)}")
            if title:
                props.append(f"title={_escape_property(title)}")
            head = "::error " + ",".join(props) if props else "::error"
            self.line(f"{head}::{_escape_data(message)}")
        else:
            where = f"{file}: " if file else ""
            self.line(f"error: {where}{message}")

    def summary(self, markdown: str) -> None:
        """Append to the job's step summary; a no-op outside Actions."""
        if self.summary_path:
            with Path(self.summary_path).open("a", encoding="utf-8") as fh:
                fh.write(markdown.rstrip("\n") + "\n")

    def output(self, name: str, value: str) -> None:
        """Set a step output (`$GITHUB_OUTPUT`); a no-op outside Actions. One line only."""
        if "\n" in value or "\r" in value or "=" in name:
            raise ValueError(f"step output {name!r}: one line, a name without '='")
        if self.output_path:
            with Path(self.output_path).open("a", encoding="utf-8") as fh:
                fh.write(f"{name}={value}\n")
