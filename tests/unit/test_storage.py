"""The storage backend interface (dyntool/storage), as one conformance class every backend runs
(:class:`BackendTests`, as zarr's ``StoreTests``): a local folder, an S3-compatible server (moto, the
fixture of tests/integration/test_s3.py), a ``file://`` prefix through obstore, and a backend of
nothing but the base's primitives over a dict (``tests/unit/memory_backend.py``: what the derived
defaults give a new backend for free).  Below the class: the local one's atomic writes, links and
FIFOs, the object store's big folders and error lines."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dyntool import safeio
from dyntool.errors import RunError
from dyntool.run import open_run
from dyntool.storage import Backend, LocalBackend, ObjectStoreBackend, Outside, open_backend
from dyntool.storage.base import POLL_SECONDS
from tests.unit.memory_backend import MemoryBackend


try:                                  # the moto S3 server fixture; without obstore/moto the s3 cases skip
    from tests.integration.test_s3 import BUCKET, s3  # noqa: F401
except pytest.skip.Exception:
    BUCKET = s3 = None


class BackendTests:
    """What every backend must do.  A subclass says how to make a fresh, empty location."""

    local = False            # a disk: plain files, empty folders exist, links, stat signatures
    by_location = True       # reachable through open_backend (a checkpoint is saved by its location)

    @pytest.fixture
    def backend(self, request, tmp_path) -> Backend:
        raise NotImplementedError

    def folder(self, backend, name: str) -> None:
        """Make ``name`` hold files (a disk needs the folder first; objects make prefixes)."""
        if self.local:
            (backend.where / name).mkdir()

    def test_get_put_exists_delete(self, backend):
        assert backend.get("meta.json") is None and not backend.exists("meta.json")
        backend.put("meta.json", b'{"a": 1}')
        backend.put("meta.json", b'{"a": 2}')                       # replaced whole
        assert backend.get("meta.json") == b'{"a": 2}' and backend.exists("meta.json")
        with pytest.raises(RunError, match="already exists"):
            backend.put("meta.json", b"{}", exclusive=True)
        with pytest.raises(safeio.BadFile, match="limit"):
            backend.get("meta.json", cap=3)
        self.folder(backend, "sub")
        backend.put("sub/x.bin", b"\0" * 10)
        assert backend.list() == (["sub"], ["meta.json"])
        assert backend.list("sub") == ([], ["x.bin"])
        assert backend.exists("sub") and backend.child("sub").get("x.bin") == b"\0" * 10
        assert backend.walk("")[0] == {"meta.json", "sub/x.bin"} and backend.walk("sub")[0] == {"x.bin"}
        assert backend.size() >= 18
        backend.delete("sub")
        assert not backend.exists("sub") and backend.get("meta.json") == b'{"a": 2}'
        backend.delete()
        assert backend.get("meta.json") is None

    def test_append_and_appender(self, backend):
        backend.append("log.jsonl", '{"step": 0}\n')
        backend.append("log.jsonl", '{"step": 1}\n')
        assert list(backend.lines("log.jsonl")) == [b'{"step": 0}\n', b'{"step": 1}\n']
        w = backend.appender("metrics.jsonl")
        for i in range(3):
            w.write(f'{{"step": {i}}}\n')
        w.close()                                                   # an object store's: PUT on close
        assert backend.get("metrics.jsonl") == b"".join(f'{{"step": {i}}}\n'.encode() for i in range(3))
        assert list(backend.lines("missing.jsonl")) == []

    def test_write_with_open_file_and_what_is(self, backend):
        """A large object streamed in (a checkpoint): atomic on every backend, read back as a file."""
        assert backend.what_is("big.bin") == "missing"
        with pytest.raises(FileNotFoundError):
            with backend.open_file("big.bin"):
                pass

        def write(target):                     # a temp file's Path (a disk) or a buffer (one PUT)
            target.write_bytes(b"v1") if isinstance(target, Path) else target.write(b"v1")
        backend.write_with("big.bin", write)
        with backend.open_file("big.bin") as f:
            assert f.read() == b"v1"
        assert backend.what_is("big.bin") == "file" and backend.has("big.bin") and not backend.has("nope")

        def fails(target):
            raise RuntimeError("the writer broke half-way")
        with pytest.raises(RuntimeError):
            backend.write_with("big.bin", fails)
        assert backend.get("big.bin") == b"v1" and backend.list() == ([], ["big.bin"])   # old kept, no temp
        self.folder(backend, "sub")
        backend.put("sub/x", b"1")
        assert backend.what_is("sub") == "folder"

    def test_checkpoint_save_and_load(self, backend):
        if not self.by_location:
            pytest.skip("a checkpoint is saved by its location: this backend has none open_backend knows")
        import torch

        from dyntool.train import checkpoint
        where = backend.where / "checkpoint.pt"
        checkpoint.save({"step": 3, "w": torch.arange(4.0)}, where)
        assert backend.what_is("checkpoint.pt") == "file"
        with backend.open_file("checkpoint.pt") as f:
            sd = torch.load(f, weights_only=True)
        assert sd["step"] == 3 and sd["format_version"] == checkpoint.FORMAT_VERSION
        with pytest.raises(RunError, match="not a dyntool training checkpoint"):
            checkpoint.load(where)                                  # read back, then its keys checked
        with pytest.raises(RunError, match="can't be read"):
            checkpoint.load(backend.where / "missing.pt")

    def test_create_run_and_is_run(self, backend):
        parent = backend
        run = parent.create("r1")
        assert not run.is_run()
        run.put("config.json", b"{}", exclusive=True)
        run.put("meta.json", b"{}")
        assert run.is_run() and parent.child("r1").is_run() and parent.list()[0] == ["r1"]
        with pytest.raises(RunError, match="already exists"):
            parent.create("r1")
        assert run.contained()

    def test_runs_yields_child_backends_that_open_as_runs(self, backend):
        """A folder of runs and a study folder: the listing yields each run's backend, in name
        order, never a run inside a run, nothing in ``.hidden`` or ``*.zarr``; ``open_run`` takes it."""
        for name in ("b", "a", "study/s1", "study/s0", "a/inner", ".hidden/h", "x.zarr/z"):
            for part in [name.split("/")[0], name] if "/" in name else [name]:
                if not backend.exists(part):
                    self.folder(backend, part)
            backend.put(f"{name}/meta.json", b'{"kind": "toy", "status": "finished"}')
        self.folder(backend, "empty")
        found = list(backend.runs())
        assert [str(b.where.relative_to(backend.where)) for b in found] == ["a", "b", "study/s0", "study/s1"]
        assert all(type(b) is type(backend) for b in found)
        run = open_run(found[2])
        assert run.kind == "toy" and run.status == "finished" and run.path == backend.where / "study" / "s0"
        assert [b.where for b in backend.child("study").runs(max_depth=0)] == []
        with pytest.raises(RunError, match="not a dyntool run"):
            open_run(backend.child("study"))

    def test_zarr_store_round_trip_and_reader(self, backend):
        from dyntool.record.ranks import RECORD_DIR, open_record
        from dyntool.record.store_writer import StoreWriter
        run = backend.create("rec")
        assert not run.has_group(RECORD_DIR) and open_record(run) is None
        w = StoreWriter(run.zarr_store(RECORD_DIR, "w"), chunk_steps=2, flush_seconds=0)
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        for i in range(3):
            w.append(i, {"x": data[i]})
        w.close()
        r = open_record(run)
        assert r.steps_written == 3 and not r.problems
        np.testing.assert_array_equal(r["x"][:], data)
        import zarr
        g = zarr.open_group(store=run.zarr_store(RECORD_DIR, "r"), mode="r")
        assert g.attrs["steps_written"] == 3

    def test_check_out_and_clean_up_after_a_rejection(self, backend):
        backend.check_out()
        mark = backend.mark()
        made = backend.create("rejected")
        made.put("config.json", b"{}", exclusive=True)
        kept = backend.create("logged")
        kept.put("config.json", b"{}", exclusive=True)
        kept.append("metrics.jsonl", '{"step": 0}\n')
        backend.clean_up(mark)
        assert not backend.child("rejected").exists("config.json")
        assert backend.child("logged").exists("metrics.jsonl")      # a run that logged rows keeps them

    def test_what_only_one_kind_of_place_has_is_asked_of_the_backend(self, backend, monkeypatch):
        """The capabilities consumers ask instead of telling a folder from a URL themselves."""
        import types

        from dyntool.storage import base
        assert backend.is_dir()                                   # a prefix: always, without a LIST
        assert backend.plain_files == self.local                  # matplotlib/netCDF write local files only
        want = (backend.where / "study" / "run").resolve()         # a URL resolves to itself
        assert backend.below("study/run") == want and backend.below("./study//run") == want
        for escape in ("../x", "/etc", "study/../../x"):
            with pytest.raises(Outside):
                backend.below(escape)
        backend.put("meta.json", b"{}")
        keys = ["meta.json", "missing.json"]
        if self.local:                                            # a stat each: changes with the file
            sig = backend.signature(keys)
            backend.put("meta.json", b'{"a": 1}')
            assert sig[1] is None and backend.signature(keys) != sig
        else:                                                     # the clock: one re-read per window at most
            clock = types.SimpleNamespace(time=lambda: 7.0)
            monkeypatch.setattr(base, "time", clock)
            sig = backend.signature(keys)
            backend.put("meta.json", b'{"a": 1}')
            assert backend.signature(keys) == sig
            clock.time = lambda: 7.0 + POLL_SECONDS
            assert backend.signature(keys) != sig
        assert backend.ensure_dir() == backend.path


class TestLocal(BackendTests):
    local = True

    @pytest.fixture
    def backend(self, tmp_path):
        (tmp_path / "where").mkdir()
        return open_backend(tmp_path / "where")


class TestS3(BackendTests):
    @pytest.fixture
    def backend(self, request, tmp_path):
        if s3 is None:
            pytest.skip("obstore or moto[server] not installed")
        request.getfixturevalue("s3")
        return open_backend(f"s3://{BUCKET}/unit/{tmp_path.name}", create=True)


class TestFileURL(BackendTests):
    """The object-store backend over a ``file://`` prefix (obstore's local store)."""

    @pytest.fixture
    def backend(self, tmp_path):
        pytest.importorskip("obstore")
        return open_backend(f"file://{tmp_path}/where", create=True)


class TestMemory(BackendTests):
    by_location = False

    @pytest.fixture
    def backend(self):
        return MemoryBackend()


def test_open_backend_chooses_once_from_the_location(tmp_path):
    assert isinstance(open_backend(tmp_path), LocalBackend)
    assert isinstance(open_backend(str(tmp_path)), LocalBackend)
    if s3 is not None:
        assert isinstance(open_backend(f"file://{tmp_path}"), ObjectStoreBackend)
    with pytest.raises(RunError, match="not supported"):
        open_backend("gs://bucket/x")
    assert isinstance(open_backend(tmp_path), Backend)       # the Protocol is what callers see


def test_local_what_is_names_links_and_fifos(tmp_path):
    import os
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    b = open_backend(tmp_path)
    assert [b.what_is(k) for k in ("real", "link", "fifo")] == ["file", "link", "other"]
    with pytest.raises(safeio.BadFile, match="not a regular file"):
        with b.open_file("fifo"):                               # refused, never hangs
            pass


def test_local_put_is_atomic_and_leaves_no_temp_file(tmp_path, monkeypatch):
    b = open_backend(tmp_path)
    b.put("meta.json", b"old")

    def broken(self, data):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(type(tmp_path), "write_bytes", broken)
    with pytest.raises(OSError):
        b.put("meta.json", b"new")
    assert b.get("meta.json") == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]
    b.put("meta.json", b"new!", last_resort=True)              # full disk: rewritten in place
    assert b.get("meta.json") == b"new!"


def test_local_reads_never_follow_a_link_out_of_the_root(tmp_path):
    (tmp_path / "secret.json").write_text("{}")
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "meta.json").symlink_to(tmp_path / "secret.json")
    b = open_backend(run, root=tmp_path / "runs")
    with pytest.raises(Outside):
        b.get("meta.json")
    assert open_backend(run, root=tmp_path).get("meta.json") == b"{}"


def test_choosing_the_object_store_backend_makes_no_request(monkeypatch):
    """open_backend only picks a class: no credentials are needed until the first request."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    pytest.importorskip("obstore")
    b = open_backend("s3://some-bucket/runs/r1")
    assert not b.plain_files and b.is_dir() and b.root is None and b.path == "s3://some-bucket/runs/r1"
    assert b.ensure_dir() == "s3://some-bucket/runs/r1"
    with pytest.raises(RunError, match="no AWS credentials"):
        b.is_run()


def test_local_is_dir_and_ensure_dir(tmp_path):
    (tmp_path / "file").write_text("x")
    assert not open_backend(tmp_path / "file").is_dir() and not open_backend(tmp_path / "nothing").is_dir()
    made = open_backend(tmp_path / "a" / "b").ensure_dir()
    assert made == tmp_path / "a" / "b" and made.is_dir()
    with pytest.raises(RunError, match="can't be created"):
        open_backend(tmp_path / "file" / "sub").ensure_dir()


def test_an_s3_error_says_its_code_and_message_first():
    """Was: '... 404 Not Found: <?xml version="1.0" encoding="utf-8"?>', the reason cut off."""
    from dyntool.storage.remote import short
    body = ('<?xml version="1.0" encoding="utf-8"?>\n<Error><Code>InvalidAccessKeyId</Code><Message>The AWS '
            'Access Key Id you provided does not exist in our records.</Message><AWSAccessKeyId>AKIASECRET'
            '</AWSAccessKeyId></Error>')
    e = Exception("Generic S3 error: Error performing list request: Error performing GET http://h/b?list-type=2 "
                  f"in 171.2ms - Server returned non-2xx status code: 403 Forbidden: {body}\n\nDebug source:\n{body}")
    assert short(e) == ("InvalidAccessKeyId: The AWS Access Key Id you provided does not exist in our records. "
                        "(Generic S3 error: Error performing list request: Error performing GET http://h/b?list-type=2 "
                        "- Server returned non-2xx status code: 403 Forbidden)")
    assert "AKIASECRET" not in short(e)
    assert short(Exception("connection refused\ndetails")) == "connection refused"
    assert short(ValueError("")) == "ValueError"


def test_a_folder_of_big_runs_is_walked_instead_of_listed_whole(tmp_path, monkeypatch):
    """Past LISTED_MAX objects one listing would page through every chunk of every run: the
    folder-by-folder walk finds the same runs."""
    pytest.importorskip("obstore")
    from dyntool.storage import objects
    b = open_backend(f"file://{tmp_path}/runs", create=True)
    for name in ("b", "a", "study/s0", "a/inner"):
        b.put(f"{name}/meta.json", b"{}")
        b.put(f"{name}/record.zarr/x/c/0", b"0")
    listed = [x.where for x in b.runs()]
    assert all(x.listed is not None for x in b.runs())
    monkeypatch.setattr(objects, "LISTED_MAX", 3)
    walked = list(b.runs())
    assert [x.where for x in walked] == listed == [b.where / n for n in ("a", "b", "study/s0")]
    assert all(x.listed is None for x in walked)
