"""The examples of docs/tf.md run as doctests (pytest's doctest-glob only covers README.md)."""

from __future__ import annotations

import doctest
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "tf.md"


def test_docs_tf_md_examples_run():
    result = doctest.testfile(
        str(DOC), module_relative=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    assert result.attempted >= 10
    assert result.failed == 0
