"""mkdocs hooks: the Reference pages made from the code at every build, and the repository files
the pages link to.

- `reference/cli.md`: `hpc-ds1 --help` and every sub-command's help, from `hpc_ds1.cli`'s own
  parser (`build_parser()`), so the page is what the installed command prints.
- `reference/settings.md`: every field of `hpc_ds1.settings.Settings`: its variable, type,
  default and description, followed by `docs/settings-notes.md` (the longer notes).
- `reference/http.md`: the gateway's OpenAPI document (`create_app(...).openapi()`, built
  without NATS or Postgres), rendered as a page, with the JSON beside it (`reference/openapi.json`).
- `reference/events.md`: every JSON Schema in `schemas/` (`make schemas`).
- A link from a page to a file of the repository outside `docs/` (`../tests/workloads/data/heat.c`)
  is served as `repo/<path>`; a link to a file that is not there stays broken, and
  `mkdocs build --strict` fails on it as on any other.

Nothing is fetched from a network; nothing generated is written into `docs/`.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
REPO_LINK = re.compile(r"(\]\()(\.\./[^)\s#]+)(#[^)\s]*)?(\))")
CLI = "reference/cli.md"
SETTINGS = "reference/settings.md"
HTTP = "reference/http.md"
OPENAPI_JSON = "reference/openapi.json"
EVENTS = "reference/events.md"


# ---------------------------------------------------------------------------------------------
# the CLI


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # argparse keeps its sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of one already listed
                    continue
                seen.add(id(sub))
                out.append((name, sub))
                out += [(f"{name} {n}", s) for n, s in _subcommands(sub)]
    return out


def render_cli() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal's width: fix it
    from hpc_ds1.cli import build_parser

    parser = build_parser()
    commands = _subcommands(parser)
    lines = [
        "# The CLI, every command",
        "",
        "Generated at build time from the parser of `hpc-ds1` (`hpc_ds1.cli.build_parser()`),",
        "so this is what `hpc-ds1 COMMAND --help` prints. The guide with examples is",
        "[The CLI](../cli.md).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                helps[choice.dest] = (choice.help or "").replace("|", "\\|")
    for name, _ in commands:
        if " " not in name:
            lines.append(f"| [`hpc-ds1 {name}`](#hpc-ds1-{name}) | {helps.get(name, '')} |")
    lines += ["", "## `hpc-ds1`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in commands:
        level = "###" if " " in name else "##"
        anchor = "hpc-ds1-" + name.replace(" ", "-")
        lines += [f"{level} `hpc-ds1 {name}` {{#{anchor}}}", "", "```text"]
        lines += [sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# settings


def _cell(value: Any) -> str:
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text


def render_settings() -> str:
    from pydantic_core import PydanticUndefined

    from hpc_ds1.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    lines = [
        "# Settings",
        "",
        "Every setting is an environment variable, validated when a command starts (a wrong",
        "value stops it with the field and what is accepted). Generated at build time from",
        "`hpc_ds1.settings.Settings`: the variable, its type, its default and the field's own",
        "description. The notes after the table say more about the ones that need it.",
        "",
        "| variable | type | default | description |",
        "|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        default = field.default
        if default is PydanticUndefined:
            shown = "required"
        elif default is None:
            shown = "unset"
        else:
            shown = f"`{default}`"
        annotation = field.annotation
        kind = annotation.__name__ if isinstance(annotation, type) else str(annotation)
        kind = kind.replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")
        bounds = [
            f"{sym} {getattr(m, attr)}"
            for m in field.metadata
            for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
            if getattr(m, attr, None) is not None
        ]
        if bounds:
            kind += " (" + ", ".join(bounds) + ")"
        env = f"{prefix}{name}".upper()
        lines.append(
            f"| `{env}` | {_cell(kind)} | {_cell(shown)} | {_cell(field.description or '')} |"
        )
    notes = REPO / "docs" / "settings-notes.md"
    if notes.exists():
        lines += ["", notes.read_text()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# HTTP, from OpenAPI


def openapi() -> dict[str, Any]:
    from hpc_ds1.settings import Settings

    try:
        from hpc_ds1.services.gateway.app import create_app
    except ModuleNotFoundError as error:  # the gateway's layout moved: its package's own name
        if error.name != "hpc_ds1.services.gateway.app":
            raise
        from hpc_ds1.services.gateway import create_app  # type: ignore[attr-defined,no-redef]
    settings = Settings(home=Path(os.environ.get("TMPDIR", "/tmp")) / "hpc-ds1-docs-home")
    # no NATS, no Postgres: the routes are declared, never called
    return create_app(settings, None, None).openapi()  # type: ignore[arg-type]


def _schema_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#schema-{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items'))}"
    return f"`{schema.get('type', 'object')}`"


def render_http(spec: dict[str, Any]) -> str:
    lines = [
        f"# HTTP API ({spec['info']['title']} {spec['info']['version']})",
        "",
        "Generated at build time from the gateway's OpenAPI document (the same one a running",
        "gateway serves at `/openapi.json`, with Swagger UI at `/docs`); the raw document is",
        "[openapi.json](openapi.json). Who may call what, retries with `Idempotency-Key` and the",
        "errors: [HTTP](../http.md).",
        "",
        spec["info"].get("description", ""),
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            tag = (op.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((path, method, op))
    lines += ["| method and path | summary |", "|---|---|"]
    for tag in sorted(by_tag):
        for path, method, op in by_tag[tag]:
            anchor = op.get("operationId", f"{method}-{path}").lower()
            lines.append(f"| [`{method.upper()} {path}`](#{anchor}) | {op.get('summary', '')} |")
    lines.append("")
    for tag in sorted(by_tag):
        lines += [f"## {tag}", ""]
        for path, method, op in by_tag[tag]:
            anchor = op.get("operationId", f"{method}-{path}").lower()
            lines += [f"### `{method.upper()} {path}` {{#{anchor}}}", ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            params = op.get("parameters") or []
            if params:
                lines += ["| parameter | in | required | type |", "|---|---|---|---|"]
                for p in params:
                    kind = _schema_name(p.get("schema"))
                    required = "yes" if p.get("required") else "no"
                    lines.append(f"| `{p['name']}` | {p['in']} | {required} | {kind} |")
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                lines += [f"Body ({media}): {_schema_name(content.get('schema'))}", ""]
            responses = op.get("responses") or {}
            if responses:
                lines += ["| status | what | body |", "|---|---|---|"]
                for status, resp in responses.items():
                    schema = next(iter(resp.get("content", {}).values()), {}).get("schema")
                    what = _cell(resp.get("description", ""))
                    lines.append(f"| {status} | {what} | {_schema_name(schema)} |")
                lines.append("")
    schemas = spec.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
        for name, schema in sorted(schemas.items()):
            lines += [f"### `{name}` {{#schema-{name.lower()}}}", ""]
            if schema.get("description"):
                lines += [schema["description"].strip(), ""]
            props = schema.get("properties") or {}
            if props:
                required = set(schema.get("required") or [])
                lines += ["| field | type | required |", "|---|---|---|"]
                for field, sub in props.items():
                    need = "yes" if field in required else ""
                    lines.append(f"| `{field}` | {_schema_name(sub)} | {need} |")
                lines.append("")
            elif schema.get("enum"):
                lines += ["One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# events, from schemas/


def _json_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return "`" + schema["$ref"].rsplit("/", 1)[-1] + "`"
    if "anyOf" in schema:
        return " or ".join(_json_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_json_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema and not schema.get("properties"):
        extra = schema["additionalProperties"]
        inner = _json_type(extra) if isinstance(extra, dict) else "any"
        return f"object of {inner}"
    return f"`{kind}`"


def _fields(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties") or {}
    if not props:
        return []
    required = set(schema.get("required") or [])
    lines = ["| field | type | required | default |", "|---|---|---|---|"]
    for name, sub in props.items():
        default = f"`{json.dumps(sub['default'])}`" if "default" in sub else ""
        need = "yes" if name in required else ""
        lines.append(f"| `{name}` | {_json_type(sub)} | {need} | {_cell(default)} |")
    return [*lines, ""]


def render_events() -> str:
    folder = REPO / "schemas"
    lines = [
        "# Events",
        "",
        "Generated at build time from `schemas/`, the JSON Schema of every event that",
        "`make schemas` writes from the event models (`libs/hpc_ds1/events/catalog.py`; a test",
        "fails when they drift). How the log, the bus and the projector use them:",
        "[Concepts](../concepts.md#events); reading the log from outside:",
        "[Watching the log](../watching.md).",
        "",
        "| event | version | subject | what |",
        "|---|---|---|---|",
    ]
    events = []
    for path in sorted(folder.glob("*.json")):
        schema = json.loads(path.read_text())
        if path.name == "envelope.json":
            continue
        name, _, version = path.stem.rpartition(".v")
        events.append((name, version, schema))
        subject = schema.get("x-subject", "")
        what = _cell((schema.get("description") or "").split("\n")[0])
        anchor = name.replace(".", "").replace("_", "")
        lines.append(f"| [`{name}`](#{anchor}) | {version} | `{subject}` | {what} |")
    envelope = folder / "envelope.json"
    if envelope.exists():
        schema = json.loads(envelope.read_text())
        lines += ["", "## The envelope", "", schema.get("description", ""), ""]
        lines += _fields(schema)
    for name, version, schema in events:
        anchor = name.replace(".", "").replace("_", "")
        lines += [f"## `{name}` (v{version}) {{#{anchor}}}", ""]
        if schema.get("description"):
            lines += [schema["description"], ""]
        if schema.get("x-subject"):
            lines += [f"Subject: `{schema['x-subject']}`", ""]
        lines += _fields(schema)
        for def_name, sub in sorted((schema.get("$defs") or {}).items()):
            lines += [f"`{def_name}`" + (f": {sub['description']}" if "description" in sub else "")]
            lines += ["", *_fields(sub)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the hooks


def on_files(files: Files, config: Any) -> Files:
    spec = openapi()
    generated = {
        CLI: render_cli(),
        SETTINGS: render_settings(),
        HTTP: render_http(spec),
        OPENAPI_JSON: json.dumps(spec, indent=1),
        EVENTS: render_events(),
    }
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    docs = Path(config["docs_dir"]).resolve()
    served: set[str] = set()
    for page in [f for f in files.documentation_pages() if f.abs_src_path]:
        text = Path(page.abs_src_path).read_text()
        for match in REPO_LINK.finditer(text):
            target = (Path(page.abs_src_path).parent / match.group(2)).resolve()
            if target.is_relative_to(docs) or not target.is_relative_to(REPO):
                continue
            rel = target.relative_to(REPO).as_posix()
            if target.is_file() and rel not in served:
                served.add(rel)
                files.append(File.generated(config, f"repo/{rel}", abs_src_path=str(target)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if not page.file.abs_src_path:
        return markdown
    source = Path(page.file.abs_src_path).parent
    docs = Path(config["docs_dir"]).resolve()
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        target = (source / match.group(2)).resolve()
        if target.is_relative_to(docs) or not target.is_relative_to(REPO) or not target.is_file():
            return match.group(0)  # inside docs, or missing: mkdocs judges it
        served = "repo/" + target.relative_to(REPO).as_posix()
        link = posixpath.relpath(served, here or ".")
        return f"{match.group(1)}{link}{match.group(3) or ''}{match.group(4)}"

    return REPO_LINK.sub(rewrite, markdown)
