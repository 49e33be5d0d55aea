"""The private values of a machine and their redaction: values replaced only where they stand alone, longest
first; firmware placeholders and short values left alone."""

from sysfs_fixtures import FakeSysroot

from rdna1_kmgr.host import private_values


def test_redaction_keeps_words_that_only_contain_a_value():
    hidden = private_values.PrivateValues((("/home/al", "<home>"), ("vm", "<host>"), ("al", "<user>")))
    said = "run `vm-test` in /home/alice as al; the host vm; /home/al/venv"
    assert hidden.redact(said) == "run `vm-test` in /home/alice as <user>; the host <host>; <home>/venv"


def test_values_are_collected_from_the_sysroot(tmp_path):
    tree = FakeSysroot(tmp_path / "root").users(("bob", 1000, []), ("sshd", 105, []))
    tree.file("etc/hostname", "bob-laptop.lan\n").file("sys/class/dmi/id/product_serial", "To Be Filled By O.E.M.\n")
    tree.file("sys/class/dmi/id/board_serial", "0\n").file("sys/class/net/lo/address", "00:00:00:00:00:00\n")
    values = dict(private_values.collect(tree.root).values)
    assert values == {
        "/home/bob": "<home>",
        str(tree.root / "home/bob"): "<home>",
        "bob": "<user>",
        "bob-laptop.lan": "<host>",
        "bob-laptop": "<host>",
    }  # sshd is a system user; the placeholder, "0" and the loopback's zero address are no one's


def test_a_user_name_inside_a_folder_name_goes_and_a_word_that_holds_it_stays():
    from rdna1_kmgr.host.private_values import PrivateValues

    hidden = PrivateValues((("/home/alice", "<home>"), ("alice", "<user>")), (), ("alice",))
    said = hidden.redact("torch in /home/alice/alice_sd/venv and /opt/alice-torch/lib; user alice; malice")
    assert said == "torch in <home>/<user>_sd/venv and /opt/<user>-torch/lib; user <user>; malice"


def test_full_names_and_dict_keys_are_redacted_too(tmp_path):
    tree = FakeSysroot(tmp_path / "root").users(("carol", 1000, []))
    passwd = (
        (tree.root / "etc/passwd")
        .read_text()
        .replace("carol:x:1000:1000:carol:", "carol:x:1000:1000:Carol Danvers,,,:")
    )
    (tree.root / "etc/passwd").write_text(passwd)
    hidden = private_values.collect(tree.root)
    assert hidden.redact("signed off by Carol Danvers") == "signed off by <user>"
    assert hidden.redact_value({"/home/carol/venv": ["carol"]}) == {"<home>/venv": ["<user>"]}
