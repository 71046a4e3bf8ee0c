"""Makes the demo page's two small fonts: the Hangul and the emoji of the chat demo's answers.

A machine with default fonts only (Debian's DejaVu and Liberation, what chromium pulls in) has
neither, and would draw boxes. The page loads these for those characters alone
(`unicode-range`). Run by `make demo-fonts`, which extracts Debian's fonts-nanum,
fonts-noto-color-emoji and python3-fonttools into .tools/ (never installed) and runs this with
their paths; the output is committed:

    python3 tools/demo_fonts.py --hangul NanumGothic.ttf --emoji NotoColorEmoji.ttf \
        --licenses fonts-nanum/copyright fonts-noto-color-emoji/copyright --out DIR

Both fonts are under the SIL Open Font License 1.1; Nanum's names are reserved, so the subsets
are renamed ("eco-router demo Hangul", "eco-router demo Emoji").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fontTools import subset  # type: ignore[import-not-found]
from fontTools.ttLib import TTFont  # type: ignore[import-not-found]

from eco_router.application.demo_jobs import CHAT_ANSWERS

HANGUL = "demo-hangul.ttf"
EMOJI = "demo-emoji.ttf"
LICENSE = "demo-fonts-LICENSE.txt"
# Name ids of a family's names (family, unique id, full name, PostScript name, typographic).
FAMILY_NAME_IDS = (1, 3, 4, 6, 16, 17, 21, 22)


def is_hangul(char: str) -> bool:
    return (
        "\uac00" <= char <= "\ud7a3" or "\u1100" <= char <= "\u11ff" or "\u3130" <= char <= "\u318f"
    )


def is_emoji(char: str) -> bool:
    code = ord(char)
    return 0x2300 <= code <= 0x27BF or code == 0xFE0F or 0x1F000 <= code <= 0x1FAFF


def make(source: Path, chars: str, family: str, target: Path) -> None:
    font = TTFont(source, recalcTimestamp=False)
    options = subset.Options()
    options.layout_features = ["*"]
    options.hinting = False
    options.name_IDs = ["*"]
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=chars)
    subsetter.subset(font)
    for record in font["name"].names:
        if record.nameID in FAMILY_NAME_IDS:
            postscript = record.nameID == 6
            record.string = family.replace(" ", "-") if postscript else family
    font.save(target)


def font_licence(copyright_file: Path) -> str:
    """The OFL paragraph of a Debian copyright file (DEP-5), as plain text."""
    for paragraph in copyright_file.read_text().split("\n\n"):
        lines = paragraph.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("License:")]
        if starts and ("OFL" in lines[starts[0]] or "SIL" in lines[starts[0]]):
            body = [line[1:] for line in lines[starts[0] + 1 :] if line.startswith(" ")]
            if len(body) > 5:
                return "\n".join("" if line == "." else line for line in body)
    raise SystemExit(f"{copyright_file}: no OFL paragraph")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hangul", type=Path, required=True, help="NanumGothic.ttf")
    parser.add_argument("--emoji", type=Path, required=True, help="NotoColorEmoji.ttf")
    parser.add_argument("--licenses", type=Path, nargs=2, required=True, help="copyright files")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    text = "".join(CHAT_ANSWERS)
    hangul = "".join(sorted({c for c in text if is_hangul(c)}))
    emoji = "".join(sorted({c for c in text if is_emoji(c)}))
    make(args.hangul, hangul, "eco-router demo Hangul", args.out / HANGUL)
    make(args.emoji, emoji, "eco-router demo Emoji", args.out / EMOJI)
    hangul_licence, emoji_licence = (font_licence(path) for path in args.licenses)
    (args.out / LICENSE).write_text(
        f"{HANGUL}: a subset of NanumGothic (Debian's fonts-nanum), renamed.\n\n"
        f"{hangul_licence}\n\n"
        f"{EMOJI}: a subset of Noto Color Emoji (Debian's fonts-noto-color-emoji), renamed.\n"
        "Copyright 2013-2017 Google Inc.\n\n"
        f"{emoji_licence}\n"
    )
    print(f"{HANGUL}: {len(hangul)} characters; {EMOJI}: {len(emoji)} characters")


if __name__ == "__main__":
    main()
