"""Everything a run leaves behind: run.json, results.jsonl, summary.json, trace.json, timeline.html."""
