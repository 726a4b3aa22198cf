"""Headless Chromium driven through Selenium, clicking the Airflow 3 UI as a person does.

Debian's `chromium` and `chromium-driver` (stack/bootstrap.sh installs both): both paths are given
to Selenium, so its manager never looks for (or downloads) a browser or driver of its own.
Elements are found by what a person sees (a button's text, a field's label, a dialog's role),
with the UI's own `data-testid`s where Airflow gives one; every wait is an explicit one.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

WAIT_S = 60.0  # the first load of a page compiles the UI's bundle: seconds on a busy 2-core machine
SWITCH_INPUT = "[data-scope=switch] input"  # a Chakra switch's (hidden) checkbox: is_selected() is its state


def _literal(text: str) -> str:
    """``text`` as an XPath string literal (it may hold either quote)."""
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    return "concat(" + ", \"'\", ".join(f"'{part}'" for part in text.split("'")) + ")"


class Browser:
    """One headless Chromium with a fresh profile; screenshots go to ``shots``."""

    def __init__(self, base_url: str, shots: Path, width: int = 1400, height: int = 1000):
        chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
        assert chromium, "Debian's chromium is missing (stack/bootstrap.sh installs it when run as root)"
        assert driver, "Debian's chromium-driver is missing (stack/bootstrap.sh installs it when run as root)"
        self.base_url, self.shots = base_url.rstrip("/"), shots
        shots.mkdir(parents=True, exist_ok=True)
        self._profile = tempfile.TemporaryDirectory(prefix="tidemark-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-quic", "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--disable-extensions",
                     f"--window-size={width},{height}", f"--user-data-dir={self._profile.name}"):
            options.add_argument(flag)
        try:
            self.driver = webdriver.Chrome(service=Service(executable_path=driver), options=options)
        except BaseException:
            self._profile.cleanup()
            raise

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            self._profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- pages -------------------------------------------------------------------------------
    def open(self, path: str) -> None:
        self.driver.get(f"{self.base_url}{path}")

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), f"no screenshot {path}"
        return path

    def dump(self, name: str) -> Path:
        """The DOM as it is now (selectors are found in it), beside the screenshots."""
        path = self.shots / f"{name}.html"
        path.write_text(self.driver.page_source)
        return path

    def wait(self, what: str, check, timeout_s: float = WAIT_S):
        """Until ``check(driver)`` returns something true; a stale element is a retry, not a failure."""
        def attempt(driver):
            try:
                return check(driver)
            except StaleElementReferenceException:
                return None

        return WebDriverWait(self.driver, timeout_s, poll_frequency=0.25,
                             ignored_exceptions=(StaleElementReferenceException,)).until(attempt, message=what)

    # --- elements ----------------------------------------------------------------------------
    def visible(self, by: str, selector: str, within: WebElement | None = None) -> list[WebElement]:
        root = within or self.driver
        found = []
        for element in root.find_elements(by, selector):
            try:
                if element.is_displayed():
                    found.append(element)
            except StaleElementReferenceException:
                pass
        return found

    def dialog(self, timeout_s: float = WAIT_S) -> WebElement:
        """The open modal dialog (Chakra gives it role=dialog)."""
        return self.wait("an open dialog", lambda d: (self.visible(By.CSS_SELECTOR, "[role=dialog]") or [None])[-1],
                         timeout_s)

    def trigger_dialog(self, dag_id: str) -> WebElement:
        """The DAG page's Trigger dialog, opened as a person opens it (the page's header button)."""
        self.open(f"/dags/{dag_id}")
        self.click(self.button("Trigger"))
        dialog = self.dialog()
        title = " ".join(dialog.find_element(By.TAG_NAME, "h2").text.split())
        assert f"Trigger Dag - {dag_id}" in title, title
        return dialog

    def button(self, text: str, within: WebElement | None = None, timeout_s: float = WAIT_S) -> WebElement:
        """A visible button whose text (its whole text, trimmed) is ``text``."""
        xpath = (f".//button[normalize-space(.)={_literal(text)}] | "
                 f".//*[@role='button' and normalize-space(.)={_literal(text)}]")

        def find(driver):
            root = within if within is not None else driver.find_element(By.TAG_NAME, "body")
            return (self.visible(By.XPATH, xpath, root) or [None])[0]

        return self.wait(f"a button {text!r}", find, timeout_s)

    def by_testid(self, testid: str, within: WebElement | None = None, timeout_s: float = WAIT_S) -> WebElement:
        return self.wait(f"[data-testid={testid}]", lambda d: (
            self.visible(By.CSS_SELECTOR, f"[data-testid='{testid}']", within) or [None])[0], timeout_s)

    def field_root(self, label: str, within: WebElement | None = None, timeout_s: float = WAIT_S) -> WebElement:
        """The form field (Chakra's role=group root) labelled ``label`` (its label's text starts with it)."""
        xpath = f".//*[@role='group' and ./descendant::label[1][starts-with(normalize-space(.), {_literal(label)})]]"

        def find(driver):
            root = within if within is not None else driver.find_element(By.TAG_NAME, "body")
            return (self.visible(By.XPATH, xpath, root) or [None])[0]

        return self.wait(f"the field {label!r}", find, timeout_s)

    def field(self, label: str, within: WebElement | None = None, timeout_s: float = WAIT_S) -> WebElement:
        """The input or textarea of the form field labelled ``label``."""
        root = self.field_root(label, within, timeout_s)
        return self.wait(f"the input of the field {label!r}", lambda d: (
            self.visible(By.XPATH, ".//*[self::input or self::textarea]", root) or [None])[0], timeout_s)

    def named(self, name: str, within: WebElement | None = None, timeout_s: float = WAIT_S) -> WebElement:
        """A visible button named ``name`` by its text or, for an icon button, its ``aria-label`` (what
        its tooltip shows, and what a screen reader reads)."""
        xpath = (f".//*[(self::button or @role='button') and (@aria-label={_literal(name)} or "
                 f"normalize-space(.)={_literal(name)})]")

        def find(driver):
            root = within if within is not None else driver.find_element(By.TAG_NAME, "body")
            return (self.visible(By.XPATH, xpath, root) or [None])[0]

        return self.wait(f"a button named {name!r}", find, timeout_s)

    def link(self, text: str, within: WebElement | None = None, timeout_s: float = WAIT_S) -> WebElement:
        """A visible link whose whole text (trimmed) is ``text``."""
        def find(driver):
            root = within if within is not None else driver.find_element(By.TAG_NAME, "body")
            return (self.visible(By.XPATH, f".//a[normalize-space(.)={_literal(text)}]", root) or [None])[0]

        return self.wait(f"a link {text!r}", find, timeout_s)

    def label(self, label: str, within: WebElement | None = None, timeout_s: float = WAIT_S) -> WebElement:
        """The label of the form field labelled ``label`` (``data-required`` when the form requires it)."""
        return self.field_root(label, within, timeout_s).find_element(By.TAG_NAME, "label")

    def text(self, text: str, timeout_s: float = WAIT_S) -> WebElement:
        """A visible element whose own text contains ``text``."""
        return self.wait(f"the text {text!r}", lambda d: (
            self.visible(By.XPATH, f"//body//*[contains(text(), {_literal(text)})]") or [None])[0], timeout_s)

    def choose(self, field: WebElement, option: str) -> None:
        """Pick ``option`` in a form's select (react-select, as Airflow's param forms draw an enum):
        click the box, then the option in the menu it opens."""
        box = self.wait("the select's box", lambda d: (self.visible(By.CSS_SELECTOR, "[role=combobox]", field)
                                                         or [None])[0], 10)
        self.click(box.find_element(By.XPATH, "./ancestor::div[3]"))  # react-select's control: value and arrow
        self.click(self.wait(f"the option {option!r}", lambda d: (self.visible(
            By.XPATH, f"//*[(@role='option' or contains(@id, '-option-')) and normalize-space(.)={_literal(option)}]")
            or [None])[0], 10))

    def toggle(self, field: WebElement) -> WebElement:
        """Flip a form's switch (Chakra's, as Airflow's param forms draw a boolean) by clicking its
        track; returns its input, to read ``is_selected()``."""
        switch = self.wait("the switch", lambda d: (self.visible(
            By.CSS_SELECTOR, "[data-scope=switch][data-part=control]", field) or [None])[0], 10)
        self.click(switch)
        return field.find_element(By.CSS_SELECTOR, SWITCH_INPUT)

    def outside_requests(self) -> list[str]:
        """What the current document fetched, or points its scripts, styles and images at, on another
        machine than the UI's (the Resource Timing entries and the elements' resolved URLs)."""
        from urllib.parse import urlsplit

        urls = self.driver.execute_script(
            "return performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))"
            ".map(e => e.name).concat([...document.querySelectorAll('script[src], link[href], img[src], "
            "iframe[src]')].map(e => e.src || e.href));")
        here = urlsplit(self.base_url).hostname
        return sorted({u for u in urls if urlsplit(u).scheme in ("http", "https", "ws", "wss")
                       and urlsplit(u).hostname not in (here, "127.0.0.1", "localhost")})

    def click(self, element: WebElement) -> None:
        """A real click where the element is on top; scrolled into view first."""
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
        try:
            element.click()
        except WebDriverException as exc:  # e.g. another element would receive the click
            raise AssertionError(f"cannot click {element.tag_name} {element.text!r}: {exc.msg}") from None

    def type_into(self, element: WebElement, text: str) -> None:
        self.click(element)
        element.send_keys(Keys.CONTROL, "a")
        element.send_keys(Keys.DELETE)
        element.send_keys(text)
