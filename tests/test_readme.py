"""The front door: the README's shape, the papers cited, one source for the result numbers, links that resolve, and
the version written once."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

PAPERS = {  # BibTeX key -> the paper's title as the paper itself gives it (../shared/papers)
    "ryum2025shefl": "Resource-Aware Aggregation and Sparsification in Heterogeneous Ensemble Federated Learning",
    "allouah2024fens": "Revisiting Ensembling in One-Shot Federated Learning",
    "jia2024adaptivefl": "Adaptive Heterogeneous Federated Learning for Resource-Constrained",
}


def test_readme_is_short_and_its_first_screen_reads_as_a_table_not_paragraphs():
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    long = [(i + 1, len(x)) for i, x in enumerate(lines[:60]) if len(x) > 200]
    assert long == [], long
    first = "\n".join(lines[:12])
    assert "make run" in first and "make test" in first  # the whole set-up, on the first screen
    for section in ("## Environment setup", "## Running the experiments", "## Expected results", "## Methods"):
        assert section in README, section
    assert README.index("## Environment setup") < README.index("## Running the experiments")


@pytest.mark.parametrize("key", sorted(PAPERS))
def test_each_paper_is_cited_with_bibtex(key):
    block = re.search(r"```bibtex\n(@\w+\{" + key + r",.*?)```", README, re.S)
    assert block, f"no BibTeX entry {key} in the README"
    entry = " ".join(block.group(1).split())
    assert PAPERS[key].lower() in entry.replace("{", "").replace("}", "").lower(), entry
    assert re.search(r"author\s*=", entry) and re.search(r"year\s*=\s*\{20\d\d\}", entry), entry


def test_result_tables_are_generated_from_the_committed_runs():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import headline
    finally:
        sys.path.pop(0)
    assert headline.main(["--check"]) == 0, "run: python scripts/headline.py"
    assert headline.headline() in README  # the README holds the generated tables, not a hand-typed copy


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but '-' and '_' dropped, spaces to '-',
    a repeated heading suffixed -1, -2, ...; plus explicit ``<a id="...">`` anchors. Code blocks hold no headings."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    anchors, seen = set(re.findall(r'<a (?:id|name)="([^"]+)"', text)), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_heading_anchors_follow_github_on_hand_worked_headings():
    page = "# A title\n## Labels: classes are matched by name {#labels}\n```\n# not a heading\n```\n## Notes\n## Notes\n"
    assert heading_anchors(page) == {"a-title", "labels-classes-are-matched-by-name-labels", "notes", "notes-1"}


def test_every_relative_link_of_the_readme_and_docs_resolves():
    """Each link's file exists, and its #anchor is a heading of that page (GitHub's rendering: a MyST-style
    ``{#id}`` on a heading is shown as text there, not an anchor)."""
    missing = []
    for doc in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            page = doc.parent / path if path else doc
            if not page.exists():
                missing.append(f"{doc.relative_to(ROOT)} -> {target}")
            elif anchor and page.suffix == ".md" and anchor not in heading_anchors(page.read_text()):
                missing.append(f"{doc.relative_to(ROOT)} -> {target} (no such heading)")
    assert missing == [], missing


def test_the_version_is_written_once():
    import hetfl

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert hetfl.__version__ == project["version"]
    assert f"version: {project['version']}" in (ROOT / "CITATION.cff").read_text()
    assert "__version__ = \"" not in (ROOT / "hetfl" / "__init__.py").read_text()  # derived, not a second copy


# Documented commands (every README.md and docs/*.md bash/console block): the kinds the test checks.
KINDS = re.compile(r"(hetfl-submit|hetfl|python -m hetfl\.\w+|python examples/\S+|make|flwr run|bash docker/\S+)(?=\s|$)")
# Test values for what the docs leave to the reader: shell variables and placeholders.
PLACEHOLDERS = {"<superlink-host>": "127.0.0.1", "<run-id>": "1", "<i>": "0", "HEAD_IP": "127.0.0.1",
                "WORKER_IP": "127.0.0.2", "$SERVER_IP": "127.0.0.1", "$PYTHONPATH": "", "$!": "1", "$DOCKERD_PID": "1"}
# Commands the test cannot check, each with why (matched by prefix, after the substitutions).
UNCHECKED = {
    "bash docker/build.sh": "builds the ~6 GB image (minutes, a Docker engine): .ci/run runs it through make test-docker",
    'HETFL_SANS="IP:127.0.0.1" bash docker/certs/generate.sh': "the certificate for devices on other hosts: its "
        "paragraph in docs/deployment.md says how it was checked (127.0.0.2); the script itself runs below",
    "python -m hetfl.launch --ray-address 127.0.0.1:6379": "a label in docs/ray-cluster.md's diagram, not a command",
    "python -m hetfl.launch configs/quickstart.toml --ray-address 10.78.0.1:6379": "what tests/test_ray_cluster.py "
        "runs, with its elided arguments (...); that test runs it",
    "python -m hetfl.superexec": "Flower's flower-superexec command line (its flags are Flower's); tests/test_superexec.py "
        "runs the warm SuperExec",
}
# Checked up to pre-flight that needs what an earlier documented command writes (a trained run): parsed, keys and
# values validated against the schema, the files it names not looked for.
PARSE_ONLY = {
    "python -m hetfl.launch configs/fedet/fmnist-dir0.1.toml --supernodes 20 --set \"oneshot-reuse=":
        "reuses the ensemble of the FedKD run documented right above it",
    "flwr run . hetfl-remote --stream --run-config 'dataset=\"dir:/srv/data/test\"":
        "a run on a remote federation: its dataset is the server's directory, read by the ServerApp there",
}


def _doc_blocks() -> list[tuple[str, list[str]]]:
    """(file, lines) of every bash/sh/console/plain code block of the README and docs/*.md, continuations joined."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        block, lang = None, ""
        for line in path.read_text().splitlines():
            fence = re.match(r"\s*```(\w*)", line)
            if fence and block is None:
                block, lang = [], fence.group(1)
            elif fence:
                if lang in ("", "bash", "sh", "console"):
                    text = re.sub(r"\\\n\s*", " ", "\n".join(block))
                    out.append((path.relative_to(ROOT).as_posix(), [ln.strip().removeprefix("$ ") for ln in text.splitlines()]))
                block = None
            elif block is not None:
                block.append(line)
    return out


HOME = "/HOME"  # $HOME and ~ in the documented commands; the test puts a fresh directory there
CHECKOUT = "/CHECKOUT"  # $PWD: the checkout (replaced after /tmp/, which a checkout may be under)


def _doc_commands(home: str = HOME, root: str = CHECKOUT,
                  lines: list[tuple[str, list[str]]] | None = None) -> list[tuple[str, str, str | None]]:
    """(file, command, the error line the docs show right below it, or None) of every command of the kinds KINDS
    names, in the docs' order: one command per `&&`/`;` segment, a leading `$C run --rm cli` (the compose service)
    dropped, shell variables and placeholders replaced by test values ($PWD = the checkout, $HOME and ~ = `home`)."""
    out = []
    blocks = _doc_blocks() if lines is None else lines
    for k, (where, lines) in enumerate(blocks):
        after = [*lines[1:], (blocks[k + 1][1][:1] or [""])[0] if k + 1 < len(blocks) else ""]
        for line, below in zip(lines, after, strict=True):
            line = re.split(r"\s+#|\s{3,}", line)[0].strip()  # a comment, or a diagram's second column
            for seg in re.split(r"\s*(?:&&|;)\s*", line):
                seg = re.sub(r"^\$C run --rm (-T )?cli ", "", seg)
                for key, value in PLACEHOLDERS.items():
                    seg = seg.replace(key, value)
                seg = re.sub(r"\$\{?PWD\}?", root, seg)
                seg = re.sub(r"\$\{?HOME\}?|(?<![\w/])~(?=/)", home, seg)
                body = re.sub(r"^(?:[A-Z_]+=\S+\s+)*", "", seg)  # env assignments before the command
                if re.match(r"(?:\.venv/bin/)?" + KINDS.pattern, body):
                    out.append((where, seg, below if below.startswith("error:") else None))
    return out


class _Parsed(Exception):
    """Raised by the stand-ins once a command has been parsed and its config validated: nothing runs."""


def _device_files(home: Path) -> None:
    """What the deployment docs have a device hold before its SuperNode starts: the server's CA certificate and the
    device's own ECDSA key, made here so that the supernode commands pass their real checks."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from hetfl import cluster

    (home / "data").mkdir(parents=True, exist_ok=True)  # its client-<i> of the export (only its existence is checked)
    cluster.certificates(home / "certs", ["10.77.0.1"])
    (home / "ca.crt").write_bytes((home / "certs" / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP384R1())
    (home / "supernode.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.OpenSSH,
                                                           serialization.NoEncryption()))


def check_doc_command(where: str, line: str, shown: str | None, tmp: Path, monkeypatch, capsys) -> str:
    """Check one documented command (see the test below); returns the kind it was checked as."""
    import shlex
    import subprocess

    from hetfl import cli, cluster, launch, methods

    argv = shlex.split(line.replace("/tmp/", f"{tmp}/").replace(HOME, str(tmp / "home")).replace(CHECKOUT, str(ROOT)))
    shown = shown and shown.replace("/tmp/", f"{tmp}/")
    env = {}
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):
        k, _, v = argv.pop(0).partition("=")
        env[k] = v
    for k, v in env.items():
        if k == "PYTHONPATH":
            for entry in filter(None, v.split(":")):
                monkeypatch.syspath_prepend(entry)
        monkeypatch.setenv(k, v)
    if argv[0].startswith(".venv/bin/"):
        argv[0] = argv[0].removeprefix(".venv/bin/")
    if argv[:2] == ["python", "-m"]:
        argv = ["hetfl", *argv[2:]] if argv[2] == "hetfl" else [f"hetfl.{argv[2].split('.', 1)[1]}", *argv[3:]] \
            if argv[2].startswith("hetfl.") else argv
    sub = {"hetfl.launch": "run", "hetfl.tune": "tune", "hetfl.compare": "compare", "hetfl.cluster": "cluster",
           "hetfl.export": "export", "hetfl.keys": "keys"}
    if argv[0] in sub:
        argv = ["hetfl", sub[argv[0]], *argv[1:]]
    parse_only = any(line.startswith(p) or line.removeprefix(".venv/bin/").startswith(p) for p in PARSE_ONLY)

    def expect(call, *args):
        """A documented error: exit 2 with exactly that line; else the stand-in is reached (_Parsed) or exit 0."""
        if shown:
            capsys.readouterr()
            assert call(*args) == 2, (where, line)
            assert capsys.readouterr().err.strip() == shown, (where, line)
            return
        try:
            rc = call(*args)
        except _Parsed:
            return
        assert rc == 0, f"{where}: {line}: exit {rc}: {capsys.readouterr().err[-2000:]}"

    if argv[0] == "python" and argv[1].startswith("examples/"):
        subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, check=True, capture_output=True)
        return "example"
    if argv[0] == "hetfl" and argv[1] == "run":
        if parse_only:  # the schema's checks only (keys, types, ranges), not the files the config names
            with monkeypatch.context() as m:
                m.setattr(launch, "preflight", lambda cfg, *_a, **_k: methods.validate(cfg))
                expect(launch.main, argv[2:])
            return "run (parsed)"
        expect(launch.main, argv[2:])
        return "run"
    if argv[0] == "hetfl" and argv[1] in ("tune", "compare", "export", "keys", "presets", "study"):
        expect(cli.main, argv[1:])
        return argv[1]
    if argv[0] == "hetfl" and argv[1] == "cluster":
        if shown:
            expect(cluster.main, argv[2:])
            return "cluster"
        a = cluster._parser().parse_args(argv[2:])
        try:
            plan = cluster._check_args(a)  # the whole pre-flight of the role; nothing starts
        finally:
            capsys.readouterr()
        if plan.get("home_lock"):
            plan["home_lock"].close()
        return "cluster"
    if argv[0] == "make":
        targets = {t for rule in re.findall(r"^([\w][\w -]*):", (ROOT / "Makefile").read_text(), re.M)
                   for t in rule.split()}
        assert not {x for x in argv[1:] if "=" not in x} - targets, (where, line)
        return "make"
    if argv[:2] == ["flwr", "run"]:
        # Flower's own parser for --run-config and --federation-config, then the launcher's pre-flight
        from flwr.common.config import parse_config_args

        rest, positional, opts = argv[2:], [], {}
        while rest:
            arg = rest.pop(0)
            if arg in ("--run-config", "--federation-config"):
                opts[arg] = rest.pop(0)
            elif not arg.startswith("-"):
                positional.append(arg)
        assert (ROOT / positional[0] / "pyproject.toml").is_file(), (where, line)  # the app; then the federation
        run_config = parse_config_args([opts["--run-config"]]) if "--run-config" in opts else {}
        fed = parse_config_args([opts["--federation-config"]]) if "--federation-config" in opts else {}
        if parse_only:
            methods.validate(run_config)
            return "flwr run (parsed)"
        launch.preflight(run_config, int(fed.get("num-supernodes", 10)))
        return "flwr run"
    if argv[0] == "hetfl-submit":  # docker/submit.sh as the cli service runs it, stopped before it submits
        venv = str(Path(sys.executable).parent)
        check = [] if argv[1] == "--check" else ["--check"]
        out = subprocess.run(["bash", str(ROOT / "docker" / "submit.sh"), *check, *argv[1:]], cwd=ROOT,
                             capture_output=True, text=True, env={**__import__("os").environ,
                                                                  "PATH": f"{venv}:{__import__('os').environ['PATH']}"})
        assert out.returncode == 0, f"{where}: {line}: exit {out.returncode}: {out.stderr[-2000:]}"
        return "hetfl-submit"
    if argv[0] == "bash" and argv[1].startswith("docker/"):  # run on a copy of docker/, with what it writes there
        copy = tmp / "docker-copy"
        if not copy.exists():
            import shutil

            shutil.copytree(ROOT / "docker", copy / "docker", ignore=shutil.ignore_patterns(".cache", "out"))
        out = subprocess.run(argv, cwd=copy, capture_output=True, text=True)
        assert out.returncode == 0, (where, line, out.stderr[-2000:])
        return "docker script"
    raise AssertionError(f"{where}: {line!r} is of no kind this test checks; check it or add it to UNCHECKED")


def test_every_documented_command_parses_and_passes_its_preflight(monkeypatch, capsys, tmp_path):
    """Every command of the kinds KINDS names, in README.md and docs/*.md, in the docs' order (their /tmp/ paths under
    a fresh directory; $HOME a fresh one holding the CA certificate and key the deployment docs copy to a device):
    `hetfl run` / `python -m hetfl.launch` passes the launcher's whole pre-flight (config, data, model) or, where the
    docs show an error below it, exits 2 with exactly that line; likewise `hetfl tune` (its space), `hetfl compare`
    (every method's config), `hetfl export` (its pre-flight); `hetfl cluster` passes its role's pre-flight;
    `flwr run` passes Flower's parser and the launcher's pre-flight; `hetfl-submit` passes docker/submit.sh --check;
    `make` names targets that exist; `bash docker/*.sh` runs on a copy of docker/; the examples' scripts run.
    Nothing trains. UNCHECKED lists what is not checked, each with why."""
    from hetfl import cluster, export, launch
    from hetfl import compare as compare_mod
    from hetfl import tune as tune_mod

    def fake_run(config, overrides, supernodes, *args, **kwargs):
        launch.preflight({**launch.load_preset(config), **overrides}, supernodes)
        raise _Parsed

    def fake_tune(spec, study_dir, final=True, workers=1):
        tune_mod.check_spec(spec)
        raise _Parsed

    def stop(*_a, **_k):
        raise _Parsed

    monkeypatch.setattr(launch, "run", fake_run)
    monkeypatch.setattr(tune_mod, "tune", fake_tune)
    monkeypatch.setattr(compare_mod, "run_plan", stop)
    monkeypatch.setattr(export, "export_split", stop)
    from hetfl import study as study_mod

    monkeypatch.setattr(study_mod, "run", stop)  # after the file and every method's tuning spec are checked
    home = tmp_path / "home"
    _device_files(home)
    issued = []
    monkeypatch.setattr(cluster, "certificates", lambda d, names: issued.append(names))  # the SuperLink roles' TLS
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(ROOT)
    seen: dict[str, int] = {}
    used = set()
    done = set()
    for where, line, shown in _doc_commands(HOME):
        key = line.removeprefix(".venv/bin/")
        skip = next((u for u in UNCHECKED if key.startswith(u)), None)
        if skip:
            used.add(skip)
            continue
        if (line, shown) in done:
            continue
        done.add((line, shown))
        kind = check_doc_command(where, line, shown, tmp_path, monkeypatch, capsys)
        seen[kind] = seen.get(kind, 0) + 1
    assert used == set(UNCHECKED), set(UNCHECKED) - used  # no stale entry
    for kind in ("run", "run (parsed)", "tune", "compare", "export", "cluster", "make", "flwr run", "hetfl-submit",
                 "docker script", "example", "keys", "presets", "study"):
        assert seen.get(kind), (kind, seen)  # the docs still hold commands of each kind


def test_the_documented_commands_test_fails_on_a_string_value_left_unquoted(tmp_path, monkeypatch, capsys):
    """The methods.md line of issue #75 as it stood (`--set oneshot-reuse=$PWD/...`, a bare string): rejected."""

    monkeypatch.chdir(ROOT)
    line = "python -m hetfl.launch configs/fedet/fmnist-dir0.1.toml --supernodes 20 --set oneshot-reuse=$PWD/results/kd"
    (_, bad, _), = [c for c in _doc_commands(lines=[("docs/methods.md", [line])])]
    with pytest.raises(AssertionError, match="is not a TOML value"):
        check_doc_command("docs/methods.md", bad, None, tmp_path, monkeypatch, capsys)
    # and the hetfl-submit call of docker/test-cluster.sh as it stood (run-name="$run_name", the shell ate the quotes)
    with pytest.raises(AssertionError, match="is not a TOML value"):
        check_doc_command("docker/test-cluster.sh", "hetfl-submit configs/quickstart.toml run-name=docker-test-1",
                          None, tmp_path, monkeypatch, capsys)
    fixed = [c for c in _doc_commands() if c[0] == "docs/methods.md" and "oneshot-reuse=" in c[1]]
    assert len(fixed) == 1 and f'"oneshot-reuse=\\"{CHECKOUT}/results/kd\\""' in fixed[0][1], fixed
