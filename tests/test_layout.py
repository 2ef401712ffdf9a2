"""The package's layout: what runs where is visible from its folders, and no module grows past what one reads."""

import subprocess
import sys

PLANNING = ("paths", "config", "matrix", "specs", "code", "stage")


def test_no_module_over_400_lines_and_no_report_section_over_300(root):
    sizes = {p.relative_to(root / "src"): len(p.read_text().splitlines()) for p in (root / "src").rglob("*.py")}
    assert not {str(p): n for p, n in sizes.items() if n > 400}
    assert not {str(p): n for p, n in sizes.items() if "sections" in p.parts and n > 300}


def test_the_planning_package_is_torch_free(root):
    """The Snakefile, the tests and the benches import it: ``snakemake -n`` must not load torch or numpy."""
    code = ("import sys\n" + "".join(f"import specfit.planning.{m}\n" for m in PLANNING)
            + "assert not {'torch', 'numpy', 'transformers'} & set(sys.modules), sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_no_module_imports_a_stage(root):
    """A stage is run by its rule, never imported: what stages share lives in the libraries."""
    found = [f"{p.relative_to(root)}: {line.strip()}" for p in (root / "src").rglob("*.py")
             for line in p.read_text().splitlines()
             if "specfit.stages" in line and line.lstrip().startswith(("from ", "import "))
             and "src/specfit/stages/" not in str(p)]
    assert not found
