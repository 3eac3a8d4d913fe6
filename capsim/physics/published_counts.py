"""A catalog overlay's published parameter counts against those its dimensions give
(issue 47, the third round: a published total of 1e300 billion beside a computed 8 billion
was taken).

A model entry may state the counts its model card publishes (``published.total_b``,
``published.active_b``, billions of parameters). The shipped entries agree with the counts
computed from their dimensions (physics/parameters.py) within 3%, which
tests/test_parameters.py holds to 2%; an overlay's (``--db``, ``CAPSIM_DB``) is checked
where the catalog is loaded for a command or through the Python API, to within a factor
of PUBLISHED_FACTOR either way. The check lives here, not in the schema: counting the
parameters is physics, which the catalog layer does not import.
"""

from __future__ import annotations

from pathlib import Path

from capsim.catalog.loader import Catalog, builtin_db_dir
from capsim.catalog.model_schema import Model
from capsim.errors import CatalogError
from capsim.physics.parameters import parameter_breakdown

PUBLISHED_FACTOR = 2.0
"""How far a published count (total or active) may lie from the computed one, as a factor
either way: a count off by more is a typo or another model's card."""


def published_disagreement(model: Model) -> tuple[str, str] | None:
    """The first published count of ``model`` more than PUBLISHED_FACTOR from the computed
    one, as (field, what is wrong with it); None when both agree or none is published. A
    count the card states only as a rounded label ('1T') may lie half its unit further."""
    p = model.published
    if p is None:
        return None
    counts = parameter_breakdown(model)
    vision = counts.vision if p.includes_vision else 0
    total = counts.total + (counts.mtp if p.includes_mtp else 0) + vision
    active = counts.active_by_convention(p.active_convention) + vision
    for field, stated, computed, unit in (
        ("total_b", p.total_b, total, p.total_label_unit_b),
        ("active_b", p.active_b, active, p.active_label_unit_b),
    ):
        if stated is None:
            continue
        billions = computed / 1e9
        low = billions / PUBLISHED_FACTOR - (unit or 0) / 2
        high = billions * PUBLISHED_FACTOR + (unit or 0) / 2
        if not low <= stated <= high:
            return (
                f"published.{field}",
                f"{stated:g} billion is not within a factor of {PUBLISHED_FACTOR:g} of the "
                f"{billions:.3g} billion parameters the entry's dimensions give "
                f"({max(low, 0):.3g} to {high:.3g} billion)",
            )
    return None


def check_published_counts(catalog: Catalog) -> None:
    """Refuse an overlay's model entry (one not from the built-in catalog) whose published
    counts disagree with its dimensions (published_disagreement): a CatalogError naming
    the file, the line where it can be placed, and the field."""
    builtin = builtin_db_dir().resolve()  # the loader resolves every folder it reads
    for name, path in catalog.models.origin.items():
        if Path(path).is_relative_to(builtin):
            continue
        wrong = published_disagreement(catalog.models.entries[name])
        if wrong is None:
            continue
        field, problem = wrong
        raise CatalogError(
            f"{_where(Path(path), field)}: invalid entry: {field}: {problem}",
            hint="give the count the model card states, or leave published out",
        )


def _where(path: Path, field: str) -> str:
    """``path`` with the line of ``field`` (dotted) where the file places it."""
    from capsim.catalog.yaml_errors import field_lines

    try:
        line = field_lines(path.read_text(encoding="utf-8"))(tuple(field.split(".")))
    except (OSError, ValueError):
        line = None
    return f"{path}:{line}" if line else str(path)
