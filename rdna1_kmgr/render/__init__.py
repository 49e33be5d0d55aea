"""Stage 3, render: the quirk catalog (kmod/) turned into a patch series for one source tree.

Takes a source tree and the chosen quirks and boards. Leaves OUT/series, the patches and manifest.json
(sha256s, chosen variants, self-test case count); nothing is written unless the whole series renders.
Keeps no state of its own.
"""
