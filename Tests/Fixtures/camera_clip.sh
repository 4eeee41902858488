#!/usr/bin/env bash
# Camera-like clips of a QR code, for the camera scan's tests and bench (one definition of each).
#
#   camera_clip.sh KIND QR.png OUT_FOLDER [YUY2|NV12]
#
# Writes 30 raw 1280x720 frames (1 s at 30 fps), OUT_FOLDER/f00.yuv … f29.yuv, in the format
# given (YUY2 by default, what webcams send raw, or NV12), which Tests/Fixtures/camera_node.c
# plays as a camera. The code is on
# a grey view with a fresh sensor-like noise every frame (ffmpeg's noise filter), drawn the ways a
# phone's screen held up to a webcam looks. The distortions are ffmpeg's filters, not ours.
#
# KIND: still moving tilted rotated blurred mirrored small inverted dim glare empty
set -euo pipefail
kind=$1 qr=$2 out=$3 format=${4:-YUY2}
place="overlay=(W-w)/2:(H-h)/2"
case $kind in
  still)    filter="[1]scale=420:420:flags=neighbor[q];[0][q]$place" ;;
  # Across a third of the frame in the clip's second (back to the start at each loop).
  moving)   filter="[1]scale=380:380:flags=neighbor[q];[0][q]overlay=x='300+12*n':y=170:eval=frame" ;;
  # Held at 30 degrees from the camera's axis, 7 cm tall at 30 cm: the far edge 11 % narrower than
  # the near one ((30 + 1.75) / (30 - 1.75)) and the whole foreshortened to cos 30 = 0.87.
  tilted)   filter="[1]scale=420:420:flags=neighbor,pad=iw+80:ih+80:40:40:white,perspective=x0=-30:y0=0:x1=W+30:y1=0:x2=0:y2=H:x3=W:y3=H:sense=source,scale=iw:ih*0.87[q];[0][q]$place" ;;
  # Turned 30 degrees in the picture's plane.
  rotated)  filter="[1]scale=400:400:flags=neighbor,rotate=30*PI/180:ow=rotw(30*PI/180):oh=roth(30*PI/180):c=0x787870[q];[0][q]$place" ;;
  # Out of focus: a Gaussian blur of 1.5 px on modules of about 5 px.
  blurred)  filter="[1]scale=420:420:flags=neighbor[q];[0][q]$place,gblur=sigma=1.5" ;;
  # A front camera's (or a mirror's) picture.
  mirrored) filter="[1]scale=420:420:flags=neighbor,hflip[q];[0][q]$place" ;;
  # A tenth of the frame's area: 303x303 of 1280x720.
  small)    filter="[1]scale=303:303:flags=neighbor[q];[0][q]overlay=200:120" ;;
  # A page in dark mode: light modules on dark.
  inverted) filter="[1]scale=420:420:flags=neighbor,negate[q];[0][q]$place" ;;
  # A dim screen in a bright room: dark 100, light 170 of 255.
  dim)      filter="[1]scale=420:420:flags=neighbor,lutyuv=y='100+val*70/255'[q];[0][q]$place" ;;
  # A reflection over a quarter of the code.
  glare)    filter="[1]scale=420:420:flags=neighbor,drawbox=x=0:y=0:w=210:h=210:color=white@0.55:t=fill[q];[0][q]$place" ;;
  empty)    filter="[0]null" ;;
  *) echo "camera_clip.sh: unknown kind $kind" >&2; exit 2 ;;
esac
case $format in
  YUY2) pixels=yuyv422 ;;
  NV12) pixels=nv12 ;;
  *) echo "camera_clip.sh: unknown format $format (YUY2 or NV12)" >&2; exit 2 ;;
esac
mkdir -p "$out"
ffmpeg -v error -y -f lavfi -i color=c=0x787870:s=1280x720:r=30 -loop 1 -i "$qr" \
  -filter_complex "$filter,noise=alls=6:allf=t,format=$pixels" -frames:v 30 \
  -start_number 0 -f image2 -c:v rawvideo "$out/f%02d.yuv"
chmod 755 "$out"
chmod 644 "$out"/f*.yuv
