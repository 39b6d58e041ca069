"""Fault suite, tracking: a store that cannot be used is one line naming its URI and what is
wrong; a SQLite database of another program is left alone; a store lost mid-run prints warnings
of one line each, never the store's own tracebacks, and what it refused is recorded as lost
(a sweep then ends in one line saying what was not logged)."""

from __future__ import annotations

import http.server
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from _faults import assert_one_message, assert_unchanged, invoke, snapshot

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]


def report(uri: str, tmp_path: Path) -> tuple[int, str]:
    """`report --experiment`, the lightest command that opens the store."""
    return invoke("report", "--experiment", "e", "--out", tmp_path / "curves.png", "--workdir", tmp_path / "w",
                  "--tracking-uri", uri)


class HealthOnly(http.server.BaseHTTPRequestHandler):
    """A server that answers /health and fails every API call."""

    def _answer(self) -> None:
        healthy = self.path.startswith("/health")
        self.send_response(200 if healthy else 500)
        self.end_headers()
        self.wfile.write(b"OK" if healthy else b"internal error")

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_only_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HealthOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_answers_health_but_fails_the_api_is_one_line(health_only_server, tmp_path):
    assert_one_message(*report(health_only_server, tmp_path), health_only_server, "answers /health but its API fails")


def test_sqlite_under_proc_is_one_line(tmp_path):
    uri = "sqlite:////proc/iaa-store.db"
    assert_one_message(*report(uri, tmp_path), uri, "cannot create files in /proc")


def test_sqlite_under_a_file_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    uri = f"sqlite:///{tmp_path / 'notes.txt' / 'mlflow.db'}"
    assert_one_message(*report(uri, tmp_path), uri, f"{tmp_path / 'notes.txt'} is a file, not a folder")
    assert (tmp_path / "notes.txt").read_text() == "a file, not a folder"


@pytest.mark.parametrize("form", ["path", "file-uri"])
def test_a_file_store_is_refused_pointing_to_sqlite(tmp_path, form):
    folder = tmp_path / "mlruns"
    uri = str(folder) if form == "path" else folder.as_uri()
    assert_one_message(*report(uri, tmp_path), uri, "maintenance mode", "sqlite:///PATH/mlflow.db")
    assert not folder.exists()


def test_an_unknown_scheme_is_one_line(tmp_path):
    assert_one_message(*report("bogus://host/store", tmp_path), "bogus://host/store", "unknown tracking URI scheme")


def test_a_sqlite_database_of_another_program_is_refused_and_left_alone(tmp_path):
    db = tmp_path / "people.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE people (name TEXT)")
        con.execute("INSERT INTO people VALUES ('Anna')")
    con.close()
    before = snapshot(db)
    uri = f"sqlite:///{db}"
    assert_one_message(*report(uri, tmp_path), uri, "is a SQLite database of something else", "people")
    assert_unchanged(before, db)

    from iaa.platform.tracking import connection
    from iaa.platform.tracking import store as tracking

    empty = tmp_path / "empty.db"                  # an empty file (e.g. made by touch) becomes a store
    empty.touch()
    tracking.Run.start(connection.open_store(f"sqlite:///{empty}"), "e", "r1").end()
    with sqlite3.connect(empty) as con:
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    con.close()
    assert connection.MLFLOW_TABLES <= tables
    connection.open_store(f"sqlite:///{empty}")      # and, now MLflow's, is opened again


LOST_STORE = textwrap.dedent("""
    import os, sys
    from iaa.errors import brief
    from iaa.platform.tracking import connection, store as tracking

    db = sys.argv[1]
    tracking.RETRY_EVERY_S = 0
    run = tracking.Run.start(connection.open_store("sqlite:///" + db), "e", "r1")
    run.log_metrics({"valid_acc": 0.5}, step=1)
    os.unlink(db)
    run.log_metrics({"valid_acc": 0.6}, step=2)
    run.log_params({"best": {"lr": 0.1}})       # a sweep's last params: kept as lost, not raised
    run.end()
    assert any(what.startswith("log 1 params") for what in run.lost), run.lost
    try:
        tracking.Run.start("sqlite:///" + db, "e", "r2")
    except connection.TRANSIENT as err:
        print("refused:", brief(err), file=sys.stderr)
""")


def _script(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``script`` in a process of its own (``IAA_DEBUG`` unset), given a store's path; it must succeed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("IAA_DEBUG", None)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "mlflow.db")], capture_output=True,
                          text=True, env=env, timeout=100)
    assert done.returncode == 0, done.stderr
    return done


def test_a_store_deleted_mid_run_prints_one_line_warnings_and_no_tracebacks(tmp_path):
    done = _script(LOST_STORE, tmp_path)
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr and "[SQL:" not in done.stderr, done.stderr
    assert len(lines) == 5, done.stderr          # retrying, params, metrics not logged, not marked, refused
    assert all("attempt to write a readonly database" in line for line in lines), done.stderr


QUIETED = textwrap.dedent("""
    import logging, sys
    from iaa.platform import mlflow_model
    from iaa.platform.tracking import connection, tracker

    levels = lambda: [logging.getLogger(n).level for n in ("mlflow", *connection.STORE_LOGGERS)]
    print(levels())
    connection.open_store("sqlite:///" + sys.argv[1])
    print(levels())
""")


def test_importing_the_package_leaves_logging_alone_and_opening_a_store_quiets_it(tmp_path):
    imported, opened = _script(QUIETED, tmp_path).stdout.splitlines()[-2:]
    assert "50" not in imported, imported                 # SQLAlchemy and alembic as a program set them
    assert opened == "[30, 50, 50, 50]", opened           # MLflow at WARNING, the store's loggers CRITICAL
