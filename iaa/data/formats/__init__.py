"""The formats a dataset comes in, read into parsed examples: CBT's and CNN's official files,
raw cloze questions from outside a prepared folder, and the generated demo."""
