"""Everything a run leaves behind: run.json, results.jsonl, transcripts.jsonl, summary.json, trace.json,
timeline.html (events.jsonl's one writer is :mod:`asyncroll.event_log`)."""
