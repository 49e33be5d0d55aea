"""Finding functions and statements in C the way kernel code is written."""

import pytest

from rdna1_kmgr.source import c_anchors

CODE = '''#include <linux/pci.h>
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
'''


def test_definition_skips_prototypes_and_literals():
    span = c_anchors.definition(CODE, "x.c", "helper")
    text = CODE[span.start:span.end]
    assert text.startswith("static int helper(int a)\n{") and text.endswith("return 0;\n}")


def test_initialised_table_is_a_definition_too():
    span = c_anchors.definition(CODE, "x.c", "table")
    assert CODE[span.start:span.end].endswith(".helper = helper,\n};")


def test_statement_matches_with_white_space_folded():
    span = c_anchors.statement(CODE, "x.c", "helper", "return call(a, s);")
    assert CODE[span.start:span.end] == "\t\treturn call(a,\n\t\t\t    s);\n"


def test_statement_outside_the_function_is_not_found():
    with pytest.raises(c_anchors.AnchorNotFound, match=r"x.c: statement `\.helper = helper,` in helper\(\)"):
        c_anchors.statement(CODE, "x.c", "helper", ".helper = helper,")


def test_missing_function_names_file_and_function():
    with pytest.raises(c_anchors.AnchorNotFound, match=r"x.c: function missing\(\) not found"):
        c_anchors.body(CODE, "x.c", "missing")


def test_after_includes_and_comment_above():
    assert CODE[:c_anchors.after_includes(CODE, "x.c")].endswith('#include "amdgpu.h"\n')
    at = CODE.index("\tif (a)")
    assert c_anchors.comment_above(CODE, at) == CODE.index("\t// and a }")
