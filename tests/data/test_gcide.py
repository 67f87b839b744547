"""GCIDE cleaning on entries written in the real dictd format of dict-gcide 0.48.5."""

import gzip
from pathlib import Path

from k3scale.data.corpus import normalize_document
from k3scale.data.gcide import clean_entry, decode_b64, entry_regions, read_gcide


def _clean(entry: str) -> str:
    return normalize_document(clean_entry(entry))


LOVE = """Love \\Love\\ (l[u^]v), n. [OE. love, luve, AS. lufe, lufu; akin
   to E. lief. See {Lief}.]
   1. A feeling of strong attachment; pre["e]minent kindness or
      devotion to another; affection.
      [1913 Webster]

            Of all the dearest bonds we prove
            Thou countest sons' and mothers' love
            Most sacred, most Thine own.          --Keble.
      [1913 Webster]

   8. A thin silk stuff.
      [Obs.]
      [1913 Webster]
"""


def test_love_entry_keeps_text_and_drops_markup():
    clean = _clean(LOVE)
    assert clean.startswith("Love, n. [OE. love, luve, AS. lufe, lufu; akin")
    assert "preëminent" in clean
    assert "\n1. A feeling" not in clean  # a block's wrapped lines are one paragraph
    assert "See Lief.]" in clean
    assert "Most sacred, most Thine own. --Keble." in clean
    assert "[Obs.]" in clean
    for markup in ("[1913 Webster]", "\\", "(l", "[u^]", "{", "}"):
        assert markup not in clean


def test_secondary_forms_and_wrapped_syllabified_forms():
    entry = (
        "Adjusting plane \\Adjusting plane\\, Adjusting surface \\Adjusting\n"
        'surface\\ (A["e]ronautics)\n'
        '   A small plane. -- {A`ble-mind"ed*ness}, n.\n'
        "   [1913 Webster] Ablet\n"
    )
    clean = _clean(entry)
    assert clean.startswith("Adjusting plane, Adjusting surface (Aëronautics)")
    assert "Able-mindedness, n." in clean
    assert "Webster" not in clean and "Ablet" not in clean


def test_suffix_pronunciation_and_labels():
    clean = _clean('Abandonment \\A*ban"don*ment\\ (-ment), n. (Law)\n   A giving up.\n')
    assert clean.startswith("Abandonment, n. (Law)")


def test_decode_b64_matches_dictd_digits():
    assert decode_b64("A") == 0
    assert decode_b64("Fz") == 5 * 64 + 51
    assert decode_b64("BAA") == 64 * 64


def test_read_gcide_uses_index_regions_and_skips_metadata(tmp_path: Path):
    header = b"00-database-short\n   GCIDE\n"
    first = LOVE.encode()
    second = b"Stre \\Stre\\, n.\n   Straw. [Obs.] --Chaucer.\n   [1913 Webster]\n"
    body = header + first + b"\n" + second
    (tmp_path / "gcide.dict.dz").write_bytes(gzip.compress(body))

    def b64(value: int) -> str:
        digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        out = ""
        while True:
            out = digits[value % 64] + out
            value //= 64
            if value == 0:
                return out

    second_at = len(header) + len(first) + 1
    index = "\n".join(
        [
            f"00-database-short\t{b64(0)}\t{b64(len(header))}",
            f"love\t{b64(len(header))}\t{b64(len(first))}",
            f"Love\t{b64(len(header))}\t{b64(len(first))}",
            f"Stre\t{b64(second_at)}\t{b64(len(second))}",
        ]
    )
    (tmp_path / "gcide.index").write_text(index + "\n")
    assert len(entry_regions(index)) == 2
    docs = read_gcide(tmp_path)
    assert [d.doc_id for d in docs] == [f"gcide/{len(header)}", f"gcide/{second_at}"]
    assert docs[1].text == "Stre, n. Straw. [Obs.] --Chaucer."
    assert "\n\n" not in docs[0].text
