"""Input limits shared by the package and the app.

Torch-free and import-free, so ``app.py`` can derive Gradio's upload limit from the same number
at start-up without importing the models' stack. ``sapiens2.inputs.intake`` enforces them.
"""

#: Byte budget of one image (40 MiB): the most bytes read from a file, a file object or a bytes
#: value; anything longer is refused without being read to its end. It is the app's upload limit
#: too (app.py derives Gradio's ``max_file_size`` from it), so one number governs both.
MAX_FILE_BYTES = 40 * 2**20

#: JPEGs above Pillow's pixel limit (``PIL.Image.MAX_IMAGE_PIXELS``, 89.5 MP by default) are
#: decoded reduced up to this many pixels in the file (a 200 MP phone photo); larger ones are
#: refused. libjpeg still reads every coefficient, so this bounds decoding time and, for
#: progressive JPEGs, its coefficient buffer.
MAX_REDUCED_PIXELS = 200_000_000
