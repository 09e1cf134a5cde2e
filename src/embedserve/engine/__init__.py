"""The embedding engine: schedule -> execute -> update, in a background thread."""
