"""The one markdown table writer: its header, alignment row, cells and refusals."""

import pytest

from training.core.markdown import markdown_row, markdown_table


def test_a_table_is_header_alignment_row_and_one_line_a_row():
    table = markdown_table(["name", "ms", "note"], [["xla", 1.5, ""], ["cudnn", 12, "fused"]], align="lrc")
    assert table == "| name | ms | note |\n|---|---:|:---:|\n| xla | 1.5 |  |\n| cudnn | 12 | fused |"


def test_every_column_is_left_aligned_without_align():
    assert markdown_table(["a", "b"], [[1, 2]]) == "| a | b |\n|---|---|\n| 1 | 2 |"


def test_no_rows_leaves_the_header_and_the_alignment_row():
    assert markdown_table(["a", "b"], [], align="rl") == "| a | b |\n|---:|---|"
    assert markdown_table(["a"], iter([])) == "| a |\n|---|"  # any iterable of rows


def test_a_pipe_inside_a_cell_is_escaped():
    assert markdown_table(["x | y"], [["cpu|cpu"]]).splitlines() == ["| x \\| y |", "|---|", "| cpu\\|cpu |"]


@pytest.mark.parametrize(
    ("headers", "rows", "align", "message"),
    [
        (["a", "b"], [[1]], "", "row 0 has 1 cells for 2 columns"),
        (["a", "b"], [[1, 2], [1, 2, 3]], "", "row 1 has 3 cells"),
        (["a", "b"], [], "r", "one of l, r, c for each of the 2 columns"),
        (["a"], [], "x", "one of l, r, c"),
    ],
)
def test_a_row_or_an_alignment_that_does_not_fit_the_header_is_refused(headers, rows, align, message):
    with pytest.raises(ValueError, match=message):
        markdown_table(headers, rows, align)


def test_a_row_printed_alone_reads_as_the_tables_own():
    assert markdown_row(["xla", 1.5, "", "a|b"]) == "| xla | 1.5 |  | a\\|b |"
    assert markdown_table(["a", "b"], [["x", 2]]).splitlines()[-1] == markdown_row(["x", 2])
