"""Our top-level packages must not share an import name with another installed distribution:
whichever comes first on sys.path wins, and the other one breaks where it is imported (with
transformers 5.25, Hugging Face's `kernels` lost to ours and every model import failed)."""

import contextlib
import importlib.metadata

OUR_TOP_LEVEL_PACKAGES = ("services", "shared", "kernels", "benchmarks")


def distributions_providing(import_name: str) -> set[str]:
    providers = set(importlib.metadata.packages_distributions().get(import_name, []))
    # a distribution named like the import name counts too, even without a top_level.txt
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        providers.add(importlib.metadata.distribution(import_name).metadata["Name"])
    return {name.lower() for name in providers}


def test_no_installed_distribution_shares_our_import_names():
    collisions = {
        name: sorted(distributions_providing(name) - {"pagedserve"})
        for name in OUR_TOP_LEVEL_PACKAGES
    }
    collisions = {name: others for name, others in collisions.items() if others}
    assert not collisions, f"installed distributions shadowed by our packages: {collisions}"


def test_transformers_imports_its_model_classes_beside_our_kernels_package():
    from transformers import LlamaConfig, LlamaForCausalLM

    import kernels

    assert kernels.__file__.endswith("kernels/__init__.py")
    assert LlamaForCausalLM.config_class is LlamaConfig
