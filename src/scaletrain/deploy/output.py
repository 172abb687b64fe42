"""Writing Kubernetes objects out: one YAML stream for ``kubectl apply -f -``, or a folder of files with a
``kustomization.yaml`` for ``kubectl apply -k``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from scaletrain.errors import ConfigError

__all__ = ["to_yaml", "write_folder"]


class _Dumper(yaml.SafeDumper):
    """Plain YAML as people write it: no anchors for repeated label sets, scripts and files as ``|`` blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """A multi-document YAML stream for ``kubectl apply -f -``."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def write_folder(objects: list[dict[str, Any]], folder: Path) -> list[Path]:
    """One file per object plus a ``kustomization.yaml`` listing them (``kubectl apply -k FOLDER``)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create {folder}: {exc.strerror}; pass another --out") from None
    paths = []
    for number, obj in enumerate(objects, 1):
        path = folder / f"{number:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(to_yaml([obj]), encoding="utf-8")
        paths.append(path)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [path.name for path in paths],
    }
    index = folder / "kustomization.yaml"
    index.write_text(to_yaml([kustomization]), encoding="utf-8")
    return [*paths, index]
