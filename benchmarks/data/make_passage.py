"""Write passage.txt: the English prose of SQLite's C interface documentation (public domain).

The API reference comments of ``sqlite3.h`` (Debian's libsqlite3-dev 3.40.1-2+deb12u2, file
sha256 9222d6a9e53903389cc09b103b55f786074b5cc8cb0f52a494d54eddf27559ef), in file order: each
``CAPI3REF`` comment block with its code examples, HTML tags, requirement marks (``^``) and
cross-reference brackets removed, paragraphs of 12 words or more, until 2,000 words.

    python benchmarks/data/make_passage.py [/usr/include/sqlite3.h] > benchmarks/data/passage.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

WORDS = 2000
_DIRECTIVES = ("KEYWORDS", "METHOD", "EXPERIMENTAL", "DESTRUCTOR", "CONSTRUCTOR")


def paragraphs(header: str) -> list[str]:
    """The prose paragraphs of the header's API comments, up to :data:`WORDS` words."""
    out: list[str] = []
    words = 0
    # The first comment is the header's blessing and file note, not the API's documentation.
    for block in re.findall(r"/\*\*?(.*?)\*/", header, flags=re.S)[1:]:
        text = "\n".join(re.sub(r"^\s*\*\*? ?", "", line) for line in block.splitlines())
        if "CAPI3REF" not in text:
            continue
        text = re.sub(r"<pre>.*?</pre>|<blockquote>.*?</blockquote>", "", text, flags=re.S)
        text = "\n".join(
            line
            for line in text.splitlines()
            if "CAPI3REF" not in line and not line.startswith(_DIRECTIVES)
        )
        text = re.sub(r"<[^>]+>", "", text)
        text = text.replace("^(", "").replace(")^", "").replace("^", "")
        text = re.sub(r"\[([^\]|]*)\|([^\]]*)\]", r"\2", text)  # [target|shown] -> shown
        text = re.sub(r"\[([^\]]*)\]", r"\1", text)
        text = re.sub(r" ?\(dateof:[^)]*\)", "", text)
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            if len(para.split()) >= 12:
                out.append(para)
                words += len(para.split())
        if words >= WORDS:
            break
    return out


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/include/sqlite3.h")
    header = path.read_text(encoding="utf-8")
    sys.stdout.write("\n\n".join(paragraphs(header)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
