"""The console: the seed page served by the gateway from files shipped in this package.

`templates/index.html` is a Jinja2 shell that includes one template per section
(`templates/sections/NN_name.html`, in the seed's order); `static/` holds the stylesheet, the
shared client (`console.js`), one ES module per section (`static/sections/<name>.js`) and the
vendored third-party files (`static/vendor/`, each with its licence). No CDN, no build step."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = PACKAGE_DIR / "templates"
STATIC_DIR = PACKAGE_DIR / "static"

# (file stem, section id, heading), in the seed page's order. The id is the anchor the page
# links to (#approvals, #decisions) and the name of the section's module in static/sections/.
SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("01_facility", "facility", "Facility at a glance"),
    ("02_playground", "playground", "Playground"),
    ("03_fleet", "fleet", "Devices and task placement"),
    ("04_approvals", "approvals", "Moves waiting for an engineer"),
    ("05_sessions", "sessions", "Tune a job on this machine"),
    ("06_decisions", "decisions", "Every decision the service made"),
    ("07_machine", "machine", "This machine"),
    ("08_evaluation", "evaluation", "How good it is, measured"),
    ("09_snippets", "snippets", "Plug it into existing tools"),
)

__all__ = ["PACKAGE_DIR", "SECTIONS", "STATIC_DIR", "TEMPLATES_DIR"]
