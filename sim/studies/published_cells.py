"""Reading the cells of the published-measurement tables (shared/validation/README.md,
section 1: "Empty or 'not given' means the source does not state it. 'presumed' or
'assumed' marks our inference").

Every parser takes the cell text and a list of notes; a cell that is not a plain value is
taken with a note saying what was read from it (the rule: every guess is written down),
and a cell that states nothing raises `Unusable` with one line saying which column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNKNOWN = ("not given", "not stated", "ambiguous", "unknown", "best ", "largest that fits")
BLANK = ("", "-", "ns", "n/a", "na", "?", "not given", "not stated", "not given in table")


class Unusable(Exception):
    """A row the simulator cannot be asked about; the message is the row's one-line reason."""


def is_blank(text: str) -> bool:
    return text.strip().lower() in BLANK


def states_nothing(text: str) -> bool:
    """Blank, or a cell that says outright that the value is not known."""
    low = text.strip().lower()
    return is_blank(low) or any(u in low for u in UNKNOWN)


def quote(text: str, limit: int = 60) -> str:
    """A cell as it appears in a reason or a note: quoted, one line, at most `limit` chars."""
    one = " ".join(text.split())
    return "'" + (one if len(one) <= limit else one[:limit - 3] + "...") + "'"


_NUMBER = re.compile(r"^~?\s*(\d+(?:\.\d+)?)\s*([KkM])?(?![\w.])")
_PAREN_INT = re.compile(r"\((\d+)\)")


def number(text: str, column: str, notes: list[str]) -> float | None:
    """The number a cell starts with ('4K' = 4096, '18K (18432)' = 18432, '~1538' = 1538),
    or None when the cell states nothing or does not start with a number ('<=16 ...').
    Anything after the number is recorded in `notes`."""
    t = " ".join(text.split())
    if states_nothing(t):
        return None
    m = _NUMBER.match(t)
    if m is None:
        return None
    value = float(m.group(1))
    if m.group(2):
        exact = _PAREN_INT.search(t[m.end():])
        value = float(exact.group(1)) if exact else value * (1024 if m.group(2) in "Kk" else 1024**2)
    if t[m.end():].strip() or t.startswith("~"):
        notes.append(f"{column} = {value:g} read from {quote(t)}")
    return value


def integer(text: str, column: str, notes: list[str]) -> int | None:
    """`number` for a count; a fractional count is not an integer (None)."""
    value = number(text, column, notes)
    if value is None or value != int(value):
        return None
    return int(value)


def required_int(text: str, column: str, notes: list[str]) -> int:
    value = integer(text, column, notes)
    if value is None or value <= 0:
        raise Unusable(f"{column} not given" + (f" ({quote(text)})" if text.strip() else ""))
    return value


def value_of(text: str) -> float:
    """The measured value: a plain number ('60-100', 'OOM' are refused)."""
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        raise Unusable(f"value {quote(text)} is not a number") from None
    if not value > 0:
        raise Unusable(f"value {quote(text)} is not positive")
    return value


# -- precision and recomputation ---------------------------------------------------------------

PLAIN_PRECISIONS = ("fp16", "bf16", "fp32", "fp16 mixed", "bf16 mixed")


def precision(text: str, notes: list[str]) -> str:
    """fp16 / bf16 / fp32: the first of them the cell names ('fp16 (bf16 optimizer introduced
    later)' is fp16; 'fp16 mixed' is fp16); Float8 linears are read apart (`float8_linears`)."""
    low = text.lower()
    found = sorted((low.find(p), p) for p in ("fp16", "bf16", "fp32") if p in low)
    if not found:
        raise Unusable("precision not given" + (f" ({quote(text)})" if text.strip() else ""))
    choice = found[0][1]
    if low.strip() not in PLAIN_PRECISIONS:
        notes.append(f"precision {choice} read from {quote(text)}")
    return choice


def float8_linears(text: str, other_config: str) -> bool:
    """Whether the run's Linears were Float8: the precision cell says so ('BF16 + Float8
    linears'); 'Float8 where noted' counts only when other_config notes Float8."""
    def names_fp8(cell: str) -> bool:
        return "float8" in cell.lower() or "fp8" in cell.lower()
    if "where noted" in text.lower():
        return names_fp8(text) and names_fp8(other_config)
    return names_fp8(text)


def recompute(text: str, notes: list[str]) -> str:
    """act_ckpt -> training.recompute: 'selective...' -> selective; yes / full / likely /
    checkpoint -> full; no / none / false -> none; empty -> none (recorded)."""
    low = " ".join(text.lower().split())
    if is_blank(low):
        notes.append("act_ckpt not given: no activation recomputation assumed")
        return "none"
    if low.startswith(("no", "false", "off")):
        return "none"
    if "selective" in low:
        choice = "selective"
    elif any(w in low for w in ("yes", "full", "likely", "true", "checkpoint")):
        choice = "full"
    else:
        raise Unusable(f"act_ckpt {quote(text)} is not understood")
    if low not in ("yes", "full", "selective"):
        notes.append(f"recompute {choice} read from act_ckpt {quote(text)}")
    return choice


# -- sources and reliability tiers -------------------------------------------------------------

SOURCES = (  # (substring of source + url, lower case; short name), first match wins
    ("1909.08053", "Megatron 2019"), ("tables.tex", "Megatron README 2020"),
    ("2104.04473", "Megatron SC21"), ("2205.05198", "Korthikanti 2022"),
    ("megatron-lm/blob", "Megatron-Core 2024"), ("megatron-core", "Megatron-Core 2024"),
    ("zeropp", "ZeRO++"), ("2306.10209", "ZeRO++"), ("zero++", "ZeRO++"),
    ("zero3-offload", "ZeRO-3 Offload blog"), ("2101.06840", "ZeRO-Offload"), ("zero-offload", "ZeRO-Offload"),
    ("2104.07857", "ZeRO-Infinity"), ("1910.02054", "ZeRO SC20"), ("deepspeed-azure", "DeepSpeed Azure"),
    ("deepspeed.ai/tutorials/megatron", "DeepSpeed ZeRO-2 blog"),
    ("deepspeed.ai/tutorials/zero/", "DeepSpeed ZeRO tutorial"),
    ("2304.11277", "PyTorch FSDP"), ("torchtitan", "TorchTitan"), ("2410.06511", "TorchTitan"),
    ("bigscience", "BLOOM"), ("2201.11990", "MT-NLG"), ("2205.01068", "OPT"), ("2302.13971", "LLaMA"),
    ("2407.21783", "Llama 3"), ("2204.06745", "GPT-NeoX"),
    ("llm-foundry", "llm-foundry"), ("fms-fsdp", "fms-fsdp"), ("zenflow", "DeepSpeed ZenFlow blog"),
)


def short_source(source: str, url: str) -> str:
    """A short name for the publication (README section 2), from the source text and URL;
    otherwise the source text up to its first ',', ':' or '('."""
    key = f"{source} {url}".lower()
    for needle, name in SOURCES:
        if needle in key:
            return name
    return re.split(r"[,:(]| - ", source, maxsplit=1)[0].strip()[:40] or "unknown"


EXACT_KINDS = ("table_exact", "figure_label_exact", "text_exact", "log_exact")


@dataclass(frozen=True)
class Reliability:
    confidence: str
    value_kind: str
    complete: bool   # tp, pp, micro_batch and global_batch all stated as plain numbers


def tier(r: Reliability) -> str:
    """README section 5, as far as the columns allow:
    C: confidence low, or the value came through a secondary source or notes;
    A: an exact value (table / figure label / text / log) with high confidence, or with a
       complete configuration (tp, pp, micro and global batch all stated);
    B: everything else (plot read-offs, exact values with a partial configuration)."""
    kind = r.value_kind.lower()
    if r.confidence.lower() == "low" or "secondary" in kind or "notes" in kind:
        return "C"
    exact = kind.startswith(EXACT_KINDS)
    if exact and (r.confidence.lower() == "high" or r.complete):
        return "A"
    return "B"


def plain_int(text: str) -> bool:
    return bool(re.fullmatch(r"\s*\d+\s*", text))
