#!/usr/bin/python3
"""Pictures of QR codes for QRScanTests, with Debian's python3-qrcode and
python3-pil (independent of qrencode and of the agent):

    qr_pictures.py encode TEXTFILE OUT.png LEVEL     python-qrcode, 4 px a module, 4-module border
    qr_pictures.py blank IN.png OUT.png BOX BORDER X Y W H
                                                     paints modules X..X+W, Y..Y+H white
    qr_pictures.py side IN1.png IN2.png OUT.png      both codes side by side on white
"""
import sys

from PIL import Image


def encode(text_file, out, level):
    import qrcode
    from qrcode import constants
    levels = {"L": constants.ERROR_CORRECT_L, "M": constants.ERROR_CORRECT_M,
              "Q": constants.ERROR_CORRECT_Q, "H": constants.ERROR_CORRECT_H}
    code = qrcode.QRCode(error_correction=levels[level], box_size=4, border=4)
    with open(text_file, "rb") as f:
        code.add_data(f.read())
    code.make(fit=True)
    code.make_image(fill_color="black", back_color="white").save(out)


def blank(src, out, box, border, x, y, w, h):
    image = Image.open(src).convert("L")
    left, top = (border + x) * box, (border + y) * box
    image.paste(255, (left, top, left + w * box, top + h * box))
    image.save(out)


def side(first, second, out):
    a, b = Image.open(first).convert("L"), Image.open(second).convert("L")
    gap = 40
    canvas = Image.new("L", (a.width + b.width + 3 * gap, max(a.height, b.height) + 2 * gap), 255)
    canvas.paste(a, (gap, gap))
    canvas.paste(b, (a.width + 2 * gap, gap))
    canvas.save(out)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "encode":
        encode(args[0], args[1], args[2])
    elif command == "blank":
        blank(args[0], args[1], *map(int, args[2:]))
    elif command == "side":
        side(*args)
    else:
        sys.exit("unknown command " + command)
