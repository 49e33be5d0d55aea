"""Finding functions and statements in C the way kernel code is written."""

import pytest

from rdna1_kmgr.source import c_anchors

CODE = """#include <linux/pci.h>
#include "amdgpu.h"

static int helper(int a);	/* a prototype is not a definition */

static int helper(int a)
{
	const char *s = "}{";	/* braces in strings */
	char c = '}';		/* and chars */
	// and a } in a line comment
	if (a) {
		return call(a,
			    s);
	}
	return 0;
}

static const struct funcs table = {
	.helper = helper,
};
"""


def test_definition_skips_prototypes_and_literals():
    span = c_anchors.definition(CODE, "x.c", "helper")
    text = CODE[span.start : span.end]
    assert text.startswith("static int helper(int a)\n{") and text.endswith("return 0;\n}")


def test_initialised_table_is_a_definition_too():
    span = c_anchors.definition(CODE, "x.c", "table")
    assert CODE[span.start : span.end].endswith(".helper = helper,\n};")


def test_statement_matches_with_white_space_folded():
    span = c_anchors.statement(CODE, "x.c", "helper", "return call(a, s);")
    assert CODE[span.start : span.end] == "\t\treturn call(a,\n\t\t\t    s);\n"


def test_statement_outside_the_function_is_not_found():
    with pytest.raises(c_anchors.AnchorNotFound, match=r"x.c: statement `\.helper = helper,` in helper\(\)"):
        c_anchors.statement(CODE, "x.c", "helper", ".helper = helper,")


def test_missing_function_names_file_and_function():
    with pytest.raises(c_anchors.AnchorNotFound, match=r"x.c: function missing\(\) not found"):
        c_anchors.body(CODE, "x.c", "missing")


def test_after_includes_and_comment_above():
    assert CODE[: c_anchors.after_includes(CODE, "x.c")].endswith('#include "amdgpu.h"\n')
    at = CODE.index("\tif (a)")
    assert c_anchors.comment_above(CODE, at) == CODE.index("\t// and a }")


def test_a_statement_is_found_by_any_of_its_forms_the_earliest_winning():
    forms = ["return 0;", "return call(a, s);"]
    span = c_anchors.statement(CODE, "x.c", "helper", forms)
    assert CODE[span.start : span.end] == "\t\treturn call(a,\n\t\t\t    s);\n"
    with pytest.raises(c_anchors.AnchorNotFound, match=r"statement `return 1;` or `return 2;` in helper\(\)"):
        c_anchors.statement(CODE, "x.c", "helper", ["return 1;", "return 2;"])


def test_parameters_of_a_function_and_not_of_a_table():
    span = c_anchors.parameters(CODE, "x.c", "helper")
    assert CODE[span.start : span.end] == "int a"
    with pytest.raises(c_anchors.AnchorNotFound, match="parameter list of table"):
        c_anchors.parameters(CODE, "x.c", "table")


def test_crlf_text_keeps_its_carriage_returns_in_every_span():
    crlf = CODE.replace("\n", "\r\n") + "obj-y += a.o  \r\n"
    span = c_anchors.statement(crlf, "x.c", "helper", "return call(a, s);")
    assert crlf[span.start : span.end] == "\t\treturn call(a,\r\n\t\t\t    s);\r\n"
    line = c_anchors.top_line(crlf, "Makefile", "obj-y += a.o")
    assert crlf[line.start : line.end] == "obj-y += a.o  \r\n"


def test_a_last_line_without_newline_is_a_whole_line():
    text = "a\nobj-y += a.o"
    span = c_anchors.top_line(text, "Makefile", "obj-y += a.o")
    assert text[span.start : span.end] == "obj-y += a.o"


def test_comments_are_blanked_in_place():
    text = "x = 1; /* kdev->kgd */ y = 2; // kdev->kgd\nz;"
    blank = c_anchors.without_comments(text)
    assert len(blank) == len(text) and "kgd" not in blank and blank.endswith("\nz;")


def test_a_snippet_is_matched_as_whole_words_at_its_ends():
    text = "int f(void)\n{\n\tx = kdev->adevice;\n\ty = kdev->adev;\n}\n"
    body = c_anchors.body(text, "x.c", "f")
    assert c_anchors.find(text, body, "kdev->adev") == text.index("kdev->adev;")
    assert c_anchors.find(text, body, "dev->adev") == -1


SIZED = """int acquire(void)
{
	size = base + extra;
	/* size = base + extra; in a comment is not code */
	size = ALIGN(size, PAGE_SIZE);

	err = get(vm, size);
	return err;
}
"""


def anchor(text):
    return c_anchors.statement(text, "q.c", "acquire", ["err = get(vm, size);"])


def test_an_anchor_after_every_statement_it_follows_passes():
    c_anchors.check_follows(
        SIZED, "q.c", "acquire", anchor(SIZED), ("err = get(vm, size);",), ("size = base + extra;",)
    )


def test_an_anchor_with_nothing_to_follow_before_it_is_misplaced():
    text = SIZED.replace("\tsize = ALIGN(size, PAGE_SIZE);\n", "").replace("return err;", "size = ALIGN(size, 4);")
    with pytest.raises(
        c_anchors.AnchorMisplaced, match=r"q.c: acquire\(\) has no `size = ALIGN\(size, PAGE_SIZE\);` before"
    ):
        c_anchors.check_follows(
            text, "q.c", "acquire", anchor(text), ("err = get(vm, size);",), ("size = ALIGN(size, PAGE_SIZE);",)
        )


def test_an_anchor_followed_by_the_statement_again_is_misplaced():
    text = SIZED.replace("\treturn err;", "\tsize = base + extra;\n\treturn err;")
    with pytest.raises(c_anchors.AnchorMisplaced, match=r"acquire\(\) has `size = base \+ extra;` again after"):
        c_anchors.check_follows(
            text, "q.c", "acquire", anchor(text), ("err = get(vm, size);",), ("size = base + extra;",)
        )
