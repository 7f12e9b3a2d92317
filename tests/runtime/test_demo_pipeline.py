"""``exportir.demo_pipeline.main`` runs every stage and matches eager."""

from exportir import demo_pipeline


def test_demo_pipeline_runs_every_stage_and_matches_eager(capfd, tmp_path):
    out_dir = tmp_path / "demo-out"
    assert demo_pipeline.main(out_dir) == 0
    out, err = capfd.readouterr()
    for stage in ("1. export", "2. to_edge", "3. to_program", "4. program file", "5. load",
                  "6. run", "7. compare with eager"):
        assert stage in out
    assert out.count("-> OK") == 2
    assert "Warning" not in err  # e.g. ATen resizing planned outs
    # it ends with the files it left and the next commands to try on them
    tail = out.rstrip().splitlines()[-3:]
    assert tail == [f"  {c}" for c in demo_pipeline.next_commands(out_dir)]
    assert "exportir inspect --summary" in tail[0] and "exportir run" in tail[1]
    for name in ("model.xpt", "model.pt2"):
        assert (out_dir / name).is_file() and f"{out_dir / name}" in out
