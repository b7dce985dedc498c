"""Model archives handed to `from_pretrained` with the user-dir imported: a member that would land
outside the extraction folder (`../`, an absolute path), a link or a device is refused with the
archive's name, nothing is written outside, and the user's archive is never deleted (issue 28)."""
import io
import tarfile

import pytest


def _archive(tmp_path, member: tarfile.TarInfo, data: bytes = b""):
    path = tmp_path / "model.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        folder = tarfile.TarInfo("model")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def _member(name, kind=tarfile.REGTYPE, link="", size=0):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size
    return info


def _crafted(tmp_path, case):
    outside = tmp_path / f"written_by_{case}"
    if case == "dotdot":
        return _member("model/" + "../" * 40 + str(outside).lstrip("/"), size=3), outside
    if case == "absolute":
        return _member(str(outside), size=3), outside
    if case == "symlink":
        return _member("model/link", tarfile.SYMTYPE, link=str(outside)), outside
    if case == "hardlink":
        outside.write_text("secret")
        return _member("model/hard", tarfile.LNKTYPE, link=str(outside)), None
    if case == "device":
        return _member("model/dev", tarfile.CHRTYPE), None
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink", "hardlink", "device"])
def test_a_crafted_archive_is_refused_writes_nothing_outside_and_is_kept(tmp_path, case):
    from fairseq.models.transformer_lm import TransformerLanguageModel

    import fairseq_momentum  # noqa: F401
    from fairseq_momentum.archives import UnsafeArchiveError
    member, outside = _crafted(tmp_path, case)
    archive = _archive(tmp_path, member, b"pwn" if member.isfile() else b"")
    with pytest.raises(UnsafeArchiveError, match="model.tar.gz"):
        TransformerLanguageModel.from_pretrained(str(archive))
    assert archive.is_file(), "the user's archive was deleted"
    if outside is not None:
        assert not outside.exists() and not outside.is_symlink(), f"{case} wrote outside the target"


def test_a_plain_archive_extracts_to_its_top_folder_and_is_kept(tmp_path):
    from fairseq import file_utils

    import fairseq_momentum  # noqa: F401
    archive = _archive(tmp_path, _member("model/dict.txt", size=5), b"a 1\n\n")
    folder = file_utils.load_archive_file(str(archive))
    assert archive.is_file()
    assert folder.endswith("model") and open(f"{folder}/dict.txt").read() == "a 1\n\n"
