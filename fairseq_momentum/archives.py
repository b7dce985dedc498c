"""Model archives (`from_pretrained("model.tar.gz")`) extracted without writing outside their folder.

fairseq's `file_utils.load_archive_file` calls `tarfile.extractall` with no filter, so a member
named `../x` or `/x`, or a link, writes wherever the archive says, before any checkpoint check;
it then deletes the user's archive and puts the extracted folder in its place. The replacement
installed with the user-dir extracts only regular files and folders, through tarfile's "data"
filter (no absolute paths, no `..`, nothing outside the target), into a new temporary folder,
and leaves the archive where it was.
"""
import os
import tarfile
import tempfile

from fairseq import file_utils


class UnsafeArchiveError(ValueError):
    """A model archive member that would be written outside its folder, or is not a plain file."""


def _member_filter(archive):
    def only_plain(member, dest):
        if not (member.isfile() or member.isdir()):
            raise UnsafeArchiveError(f"refusing model archive {archive}: member {member.name!r} is a link or "
                                     "device; only regular files and folders are extracted")
        if os.path.isabs(member.name):
            raise UnsafeArchiveError(f"refusing model archive {archive}: member {member.name!r} is an "
                                     "absolute path; members must be relative to the archive's folder")
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError as error:
            raise UnsafeArchiveError(f"refusing model archive {archive}: member {member.name!r}: {error}") \
                from None
    return only_plain


def extract(archive, kind: str) -> str:
    """Extract `archive` (compressed as `kind`: gz, bz2, ...) into a new folder; its top folder if
    all members share one, as fairseq does."""
    target = tempfile.mkdtemp(prefix="fairseq_momentum_archive_")
    with tarfile.open(archive, "r:" + kind) as tar:
        tar.extractall(target, filter=_member_filter(archive))
        tops = {name.split("/", 1)[0] for name in tar.getnames()}
    top = os.path.join(target, *tops) if len(tops) == 1 else target
    return top if os.path.isdir(top) else target


def load_archive_file(archive_file):
    """fairseq's function of that name, with a safe extraction that keeps the archive."""
    try:
        resolved = file_utils.cached_path(archive_file, cache_dir=None)
    except EnvironmentError:
        return None
    if os.path.isdir(resolved):
        return resolved
    return extract(resolved, os.path.splitext(archive_file)[1][1:])


def install() -> None:
    file_utils.load_archive_file = load_archive_file
