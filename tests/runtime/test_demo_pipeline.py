"""``exportir.demo_pipeline.main`` runs every stage and matches eager."""

from exportir import demo_pipeline


def test_demo_pipeline_runs_every_stage_and_matches_eager(capfd):
    assert demo_pipeline.main() == 0
    out, err = capfd.readouterr()
    for stage in ("1. export", "2. to_edge", "3. to_program", "4. program file", "5. load",
                  "6. run", "7. compare with eager"):
        assert stage in out
    assert out.count("-> OK") == 2
    assert "Warning" not in err  # e.g. ATen resizing planned outs
