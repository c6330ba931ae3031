"""hetfl: heterogeneous federated learning on Flower (SHEFL, FENS, AdaptiveFL and their baselines)."""



def _version() -> str:
    """The version, written once: pyproject.toml's [project] version (beside the package in a checkout or a FAB),
    else the installed distribution's."""
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "hetfl":
            return project["version"]
    from importlib.metadata import version

    return version("hetfl")


__version__ = _version()
