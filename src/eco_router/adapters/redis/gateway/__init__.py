"""The SSE gateway's side: the Pub/Sub feed of job events and the viewer counts."""
