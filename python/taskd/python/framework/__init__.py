"""What taskd does inside a training framework: its switch function and its step gate hooks."""
