"""Our one import name, `pagedserve`, must not be shared with another installed distribution:
whichever comes first on sys.path wins, and the other one breaks where it is imported (with
transformers 5.25, Hugging Face's `kernels` lost to our old top-level `kernels` package and every
model import failed). The folders keep their names; pyproject maps them under `pagedserve`."""

import contextlib
import importlib.metadata
import importlib.util
import tomllib
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
OUR_IMPORT_NAMES = ("pagedserve",)
FOLDERS = {
    "services": "pagedserve.services",
    "shared": "pagedserve.shared",
    "kernels": "pagedserve.kernels",
}


def distributions_providing(import_name: str) -> set[str]:
    providers = set(importlib.metadata.packages_distributions().get(import_name, []))
    # a distribution named like the import name counts too, even without a top_level.txt
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        providers.add(importlib.metadata.distribution(import_name).metadata["Name"])
    return {name.lower() for name in providers}


def test_no_installed_distribution_shares_our_import_names():
    collisions = {
        name: sorted(distributions_providing(name) - {"pagedserve"}) for name in OUR_IMPORT_NAMES
    }
    collisions = {name: others for name, others in collisions.items() if others}
    assert not collisions, f"installed distributions sharing our import name: {collisions}"


def test_pagedserve_installs_no_generic_top_level_name():
    installed = importlib.metadata.packages_distributions()
    ours = sorted(name for name, dists in installed.items() if "pagedserve" in dists)
    assert set(ours) <= {"pagedserve", "__editable___pagedserve_0_1_0_finder"}, ours


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        FOLDERS[init.relative_to(CHECKOUT).parts[0]]
        + "".join(f".{part}" for part in init.parent.relative_to(CHECKOUT).parts[1:])
        for folder in FOLDERS
        for init in (CHECKOUT / folder).rglob("__init__.py")
    }
    assert listed == on_disk, f"missing: {on_disk - listed}, stale: {listed - on_disk}"
    assert {config["package-dir"][name] for name in FOLDERS.values()} == set(FOLDERS)


def test_transformers_imports_its_model_classes_beside_our_kernels_package():
    from transformers import LlamaConfig, LlamaForCausalLM

    from pagedserve import kernels

    assert kernels.__file__.endswith("kernels/__init__.py")
    assert LlamaForCausalLM.config_class is LlamaConfig
    # an installed `kernels` (Hugging Face's, which newer transformers require) is found before
    # the checkout's folder of that name, which is last on sys.path (tests/conftest.py)
    if distributions_providing("kernels"):
        found = importlib.util.find_spec("kernels")
        assert Path(found.origin).parent != CHECKOUT / "kernels", found.origin
