"""What local engines really emit, normalised before translation: tool-argument repair,
inline <think> reasoning, text tool calls."""
