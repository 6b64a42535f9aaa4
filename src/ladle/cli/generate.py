"""`ladle generate` / `ladle chat`: text on stdout as it is generated, one timing line per
prompt on stderr.

All prompts run as one batch, but the terminal shows them in order: the first unfinished
prompt's text streams live, the others' is held until every prompt before them has ended, then
printed at once and followed live. Ctrl-C aborts the batch (no request is left in the engine),
ends the line, and exits with 130 as shells expect.
"""

from __future__ import annotations

import sys
from typing import TextIO

from ladle.outputs import RequestOutput
from ladle.sampling.params import SamplingParams

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BAD_PROMPT = 2  # ladle.cli.EXIT_BAD_OPTION


def run_generate(
    llm,
    prompts: list[str],
    params: SamplingParams,
    chat: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Stream the batch's text to `out` in prompt order; timing lines go to `err`."""
    out = out or sys.stdout
    err = err or sys.stderr
    printer = _OrderedPrinter(len(prompts), out, err)
    stream = llm.stream(
        [[{"role": "user", "content": prompt}] for prompt in prompts] if chat else prompts,
        params,
        chat=chat,
    )
    try:
        for index, output in stream:
            printer.add(index, output)
    except KeyboardInterrupt:
        stream.close()  # aborts what is still running
        out.write("\n")
        out.flush()
        print("[interrupted]", file=err)
        return EXIT_INTERRUPTED
    # A prompt that could not run is bad input: the status of any other bad option.
    return EXIT_BAD_PROMPT if printer.num_errors else 0


class _OrderedPrinter:
    """Prints each prompt's text in prompt order, streaming the one at the front."""

    def __init__(self, num_prompts: int, out: TextIO, err: TextIO) -> None:
        self.out = out
        self.err = err
        self.num_prompts = num_prompts
        self.front = 0  # the prompt whose text streams now
        self.held: dict[int, list[str]] = {}
        self.finished: dict[int, RequestOutput] = {}
        self.num_errors = 0

    def add(self, index: int, output: RequestOutput) -> None:
        completion = output.outputs[0]
        delta = completion.text_delta if not output.error else ""
        if output.finished:
            self.finished[index] = output
        if index == self.front:
            self._write(delta)
            self._advance()
        else:
            self.held.setdefault(index, []).append(delta)

    def _advance(self) -> None:
        """Close the front prompt(s) that have finished and move on to the next."""
        while self.front in self.finished:
            self._end(self.finished.pop(self.front))
            self.front += 1
            if self.front >= self.num_prompts:
                return
            self._write("".join(self.held.pop(self.front, [])))

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()

    def _end(self, output: RequestOutput) -> None:
        self.out.write("\n")
        self.out.flush()
        if output.error:
            self.num_errors += 1
            print(f"ladle: error: {output.error}", file=self.err)
            return
        completion = output.outputs[0]
        metrics = output.metrics
        num_tokens = len(completion.token_ids)
        decode_time = metrics.decode_time or 0.0
        speed = (num_tokens - 1) / decode_time if decode_time > 0 and num_tokens > 1 else 0.0
        print(
            f"[{completion.finish_reason}; {num_tokens} tokens; "
            f"ttft {metrics.time_to_first_token or 0.0:.3f}s; decode {decode_time:.3f}s; "
            f"{speed:.1f} tok/s]",
            file=self.err,
            flush=True,
        )
