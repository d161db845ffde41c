"""Count the code of both ingestion versions: ``python -m examples.ingest.measure [--markdown]``.

Per file: code lines (not blank, not a comment, not a docstring), direct PGMQ references
(``pgmq.`` in code or SQL text) and pgflow references (``pgflow.`` SQL and ``pgflow_cli`` imports).
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent
GROUPS = {
    "shared domain (kept by both)": ["domain.py", "common.py"],
    "hand-rolled": ["handrolled/app.py", "handrolled/__main__.py"],
    "step-queued": ["stepqueues/flow.py", "stepqueues/app.py", "stepqueues/__main__.py"],
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def count(path: Path) -> dict[str, int]:
    """``{"code": lines, "pgmq": references, "pgflow": references}`` of one file."""
    text = path.read_text()
    skip = _docstring_lines(ast.parse(text))
    code_lines: set[int] = set()
    pgmq = pgflow = 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER) or tok.start[0] in skip:
            continue
        code_lines.update(range(tok.start[0], tok.end[0] + 1))
        pgmq += tok.string.count("pgmq.")
        pgflow += tok.string.count("pgflow.") + tok.string.count("pgflow_cli")
    return {"code": len(code_lines), "pgmq": pgmq, "pgflow": pgflow}


def main(argv: list[str]) -> int:
    rows: list[tuple[object, ...]] = []
    for group, files in GROUPS.items():
        totals = {"code": 0, "pgmq": 0, "pgflow": 0}
        for name in files:
            c = count(ROOT / name)
            rows.append((group, name, c["code"], c["pgmq"], c["pgflow"]))
            totals = {k: totals[k] + c[k] for k in totals}
        rows.append((group, "total", totals["code"], totals["pgmq"], totals["pgflow"]))
    header = ("group", "file", "code lines", "pgmq refs", "pgflow refs")
    if "--markdown" in argv:
        print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
        for row in rows:
            print("| " + " | ".join(map(str, row)) + " |")
    else:
        for row in (header, *rows):
            print(f"{row[0]:30} {row[1]:24} {row[2]!s:>10} {row[3]!s:>9} {row[4]!s:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
