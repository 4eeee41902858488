"""Opens the built-in viewer's page in headless Chromium (selenium + chromium-driver) and
reports, as one JSON line, what the page's script did: whether it sent its offer, the text it
shows, and the address bar after it took the token out of the fragment.

usage: viewer_page_smoke.py URL [SECONDS]
"""
import json
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def main():
    url = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 20
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.set_page_load_timeout(seconds)
        driver.get(url)
        deadline = time.monotonic() + seconds
        state = None
        while time.monotonic() < deadline:
            state = driver.execute_script(
                "return window.kraklViewer ? {text: kraklViewer.text, offerSent: kraklViewer.offerSent,"
                " ended: kraklViewer.ended} : null")
            if state and state["ended"]:
                break
            time.sleep(0.1)
        # The page's DELETE (fetch keepalive) is on its way: wait (bounded) until it was answered
        # before the browser goes.
        released = None
        while time.monotonic() < deadline + 5:
            released = driver.execute_script("return window.kraklViewer ? kraklViewer.released : null")
            if released is not None:
                break
            time.sleep(0.05)
        if state is not None:
            state["released"] = released
        print(json.dumps({"state": state, "href": driver.current_url,
                          "video": driver.execute_script("return !!document.getElementById('video')")}))
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
