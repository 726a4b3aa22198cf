"""docs/spec-reference.md is generated from PipelineSpec's schema: the committed page must be what it renders."""

from tidemark.protocol.spec import PipelineSpec
from tidemark_workshop import spec_reference


def test_the_committed_spec_reference_is_what_the_models_render():
    assert spec_reference.DOC.exists(), (
        f"docs/spec-reference.md is missing: generate it with `{spec_reference.COMMAND}`")
    assert spec_reference.DOC.read_text() == spec_reference.render(), (
        f"docs/spec-reference.md differs from PipelineSpec's schema: regenerate it with `{spec_reference.COMMAND}`")


def test_every_model_and_field_of_the_schema_is_on_the_page():
    schema = PipelineSpec.model_json_schema()
    page = spec_reference.render(schema)
    for name, model in [("PipelineSpec", schema), *schema["$defs"].items()]:
        section = page.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for field in model["properties"]:
            assert f"| `{field}` |" in section, f"{name}.{field}"
        for field in model.get("required", []):
            row = section.split(f"| `{field}` |", 1)[1].split("\n")[0]
            assert "**required**" in row, f"{name}.{field} is required"


def test_field_descriptions_and_constraints_are_rendered():
    schema = {"title": "Spec", "type": "object", "required": ["size"], "additionalProperties": False,
              "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 9, "description": "how | many"},
                             "inner": {"$ref": "#/$defs/Inner", "default": {"on": True}}},
              "$defs": {"Inner": {"type": "object", "description": "The ``inner`` part.",
                                  "properties": {"on": {"type": "boolean", "default": True}}}}}
    page = spec_reference.render(schema)
    assert "| `size` | integer, 1 to 9 | **required** | how \\| many |" in page
    assert "| `inner` | [Inner](#inner) | optional; each field's default (see [Inner](#inner)) |  |" in page
    assert "## Inner\n\nAt `inner`.\n\nThe `inner` part." in page


def test_check_exits_non_zero_naming_the_file_that_differs(tmp_path, capsys):
    page = tmp_path / "spec-reference.md"
    assert spec_reference.main(["--check", "--output", str(page)]) == 1  # missing
    assert str(page) in capsys.readouterr().err
    assert spec_reference.main(["--output", str(page)]) == 0
    assert spec_reference.main(["--check", "--output", str(page)]) == 0
    page.write_text(page.read_text() + "hand edit\n")
    assert spec_reference.main(["--check", "--output", str(page)]) == 1
    err = capsys.readouterr().err
    assert str(page) in err and spec_reference.COMMAND in err
