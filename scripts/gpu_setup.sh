# Sourced by the scripts that run on a bare lent GPU machine (gpu_check_bare.sh, gpu_long_runs.sh; docs/gpu.md):
# unpacks .gpu/ (made here by scripts/gpu_payload.sh) into /tmp/site and Fashion-MNIST where the catalog looks, writes
# the console scripts of the unpacked entry points, and exports PATH, PYTHONPATH and Flower's variables. Sets PY.
mkdir -p /tmp/site/bin /usr/share/datasets/fashion-mnist
PY=$(command -v python3)
for f in .gpu/site*.tar.xz; do xz -dc -T0 "$f" | tar xf - -C /tmp/site || exit 2; done
xz -dc -T0 .gpu/fm.tar.xz | tar xf - -C /usr/share/datasets/fashion-mnist || exit 2
"$PY" - "$PY" <<'PYEOF'
import configparser, glob, os, sys
py = sys.argv[1]
for ep in glob.glob("/tmp/site/*.dist-info/entry_points.txt"):
    cp = configparser.ConfigParser(delimiters=("=",)); cp.optionxform = str; cp.read(ep)
    for name, target in (cp["console_scripts"].items() if cp.has_section("console_scripts") else []):
        mod, _, attr = target.strip().partition(":")
        path = f"/tmp/site/bin/{name}"
        with open(path, "w") as f:
            f.write(f"#!{py}\nimport functools, sys\nimport {mod} as m\n"
                    f"sys.exit(functools.reduce(getattr, {attr.split('.')!r}, m)())\n")
        os.chmod(path, 0o755)
PYEOF
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export FLWR_HOME=$PWD/.flwr FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_DISABLE_UPDATE_CHECK=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
