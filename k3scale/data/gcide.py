"""GCIDE (Webster 1913 + WordNet) from its dictd files: entries as clean, readable documents.

The dictd index (`gcide.index`) holds `headword TAB offset TAB length` with dictd's base-64
numbers; each distinct (offset, length) region of `gcide.dict.dz` is one entry. Cleaning keeps
headwords, parts of speech, etymologies, definitions, notes and quotations with their authors,
and drops the markup: source markers (`[1913 Webster]`), syllabified forms (`\\A*ban"don\\`),
pronunciations (`(l[u^]v)`), cross-reference braces (`{Narwhal}`), and turns the ASCII
accent codes (`pre["e]minent`) into Unicode.
"""

from __future__ import annotations

import gzip
import re
import unicodedata
from pathlib import Path

from k3scale.data.corpus import Document, make_document
from k3scale.errors import K3ScaleError

# dictd's base-64 digits (dictd(8), "Database format").
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {ch: i for i, ch in enumerate(_B64)}

# Combining marks for GCIDE's accent codes (webfont.txt of the GCIDE distribution):
# [a^] breve, [=a] macron, [.a] dot, ['e] acute, [`e] grave, [^o] circumflex, ["o] diaeresis,
# [~n] tilde, [,c] cedilla, [*a] ring, [-o] macron (short-long mark).
_MARK_BEFORE = {
    "=": "\u0304",
    "-": "\u0304",
    ".": "\u0307",
    "'": "\u0301",
    "`": "\u0300",
    "^": "\u0302",
    '"': "\u0308",
    "~": "\u0303",
    ",": "\u0327",
    "*": "\u030a",
}
_NAMED = {
    "ae": "æ", "AE": "Æ", "oe": "œ", "OE": "Œ", "eth": "ð", "thorn": "þ", "th": "th",
    "ng": "ng", "imac": "ī", "aum": "ä", "asl": "a", "add": "a", "udd": "u", "yogh": "ȝ",
    "root": "√", "deg": "°", "sect": "§", "sharp": "♯", "flat": "♭", "times": "×",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "theta": "θ",
    "iota": "ι", "pi": "π", "rho": "ρ", "tau": "τ", "phi": "φ",
}  # fmt: skip
_ENTITY = re.compile(r"\[([=\-.'`^\"~,*])([A-Za-z]{1,2})\]|\[([A-Za-z]{1,2})\^\]|\[([A-Za-z]+)\]")
# Syllabified forms may wrap onto the next line.
_SYLLABIFIED = re.compile(r"\\([^\\]{1,100})\\")
# A pronunciation: parentheses right after a syllabified form or a {term}, not starting with a
# capital (that is a label such as "(Zool.)"), holding accent codes or stress marks, or starting
# with a hyphen (suffix pronunciations such as "(-ment)").
_PRONUNCIATION = re.compile(r"(?<=[\\}])(,?)\s*\((?![A-Z])(?:[^()]*[\[\"`*][^()]*|-[^()]*)\)")
_BRACED = re.compile(r"\{([^{}]*)\}")
# Stress and syllable marks glued to letters inside a braced term: {A`ble-mind"ed*ness}.
_TERM_MARKS = re.compile(r"(?<=\w)[*\"`]")
# A bracket alone on a line; the dictd conversion sometimes glues the next headword after it.
_SOURCE_LINE = re.compile(r"^\s*\[[^\]]*\](\s+\S+)?\s*$")


def decode_b64(text: str) -> int:
    """A dictd base-64 number, e.g. `"Fz"` -> 371."""
    value = 0
    for ch in text:
        value = value * 64 + _B64_VALUE[ch]
    return value


def entry_regions(index_text: str) -> list[tuple[int, int]]:
    """Sorted distinct (byte offset, byte length) regions of real entries (no `00-` metadata)."""
    regions = set()
    for line in index_text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3:
            raise K3ScaleError(f"read gcide.index: malformed line {line[:60]!r}; re-download")
        if not fields[0].startswith("00-"):
            regions.add((decode_b64(fields[1]), decode_b64(fields[2])))
    return sorted(regions)


def read_gcide(dictd_dir: Path) -> list[Document]:
    """Clean documents from `gcide.dict.dz` + `gcide.index`, in dictionary order."""
    dict_path, index_path = dictd_dir / "gcide.dict.dz", dictd_dir / "gcide.index"
    for path in (dict_path, index_path):
        if not path.is_file():
            raise K3ScaleError(f"extract dict-gcide: {path} missing (rerun with --force)")
    raw = gzip.decompress(dict_path.read_bytes())
    regions = entry_regions(index_path.read_text(encoding="utf-8"))
    documents = []
    for offset, length in regions:
        # The file is ASCII except three Windows-1252 bytes (a quote, a cedilla, a superscript).
        text = raw[offset : offset + length].decode("cp1252", errors="replace")
        doc = make_document(f"gcide/{offset}", clean_entry(text))
        if doc is not None:
            documents.append(doc)
    return documents


def clean_entry(entry: str) -> str:
    """One dictionary entry's markup removed; blank-line-separated blocks are kept."""
    lines = entry.split("\n")
    kept = [line for i, line in enumerate(lines) if not _is_source_marker(lines, i)]
    text = "\n".join(kept)
    text = _PRONUNCIATION.sub(r"\1", text)
    text = _ENTITY.sub(_replace_entity, text)
    text = _replace_syllabified(text)
    text = _BRACED.sub(lambda m: _TERM_MARKS.sub("", m.group(1)), text)
    return text.replace("{", "").replace("}", "")


def _replace_syllabified(text: str) -> str:
    """`Abandon \\A*ban"don\\` -> `Abandon`; a form not preceded by its word -> the plain word."""
    pieces, start = [], 0
    for match in _SYLLABIFIED.finditer(text):
        before = text[start : match.start()]
        plain = " ".join(re.sub(r"[*\"`']", "", match.group(1)).split())
        written = ("".join(pieces) + before).rstrip()
        if _base_letters(written).lower().endswith(_base_letters(plain).lower()):
            pieces.append(before.rstrip())
        else:
            pieces.append(before + plain)
        start = match.end()
    pieces.append(text[start:])
    return "".join(pieces)


def _base_letters(text: str) -> str:
    """Text without accents, to compare `Aërodynamics` with `Aerodynamics`."""
    return "".join(ch for ch in unicodedata.normalize("NFD", text) if not unicodedata.combining(ch))


def _is_source_marker(lines: list[str], i: int) -> bool:
    """A whole-line `[...]` closing a block is a source marker (`[1913 Webster]`, `[PJC]`).

    Usage labels such as `[Obs.]` on their own line are followed by the source line, so they
    stay.
    """
    if not _SOURCE_LINE.match(lines[i]):
        return False
    return i + 1 == len(lines) or not lines[i + 1].strip()


def _replace_entity(match: re.Match) -> str:
    mark, letters, breve_letters, name = match.groups()
    if mark is not None:
        return letters[0] + _MARK_BEFORE[mark] + letters[1:]
    if breve_letters is not None:
        # [a^], [oo^]: breve over the (first) vowel.
        return breve_letters[0] + "\u0306" + breve_letters[1:]
    return _NAMED.get(name, match.group(0))
