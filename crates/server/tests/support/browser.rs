//! A real headless Chromium driven over WebDriver: Debian's `chromium` and `chromium-driver`
//! (which `scripts/test` installs), one chromedriver per browser on a port of its own, and a
//! profile directory of its own. Dropped, it stops both.

#![allow(unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

/// A browser and the chromedriver that drives it.
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn chromium() -> PathBuf {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("chromium is installed (scripts/test installs Debian's chromium)")
}

impl Browser {
    /// A desktop browser, its window `width` × `height`.
    pub async fn desktop(width: u32, height: u32) -> Browser {
        Self::start(width, height, None).await
    }

    /// A phone's screen, `width` × `height` CSS pixels (Chromium's device emulation: a
    /// headless window is never narrower than 500 pixels).
    pub async fn phone(width: u32, height: u32) -> Browser {
        let metrics = json!({"deviceMetrics": {"width": width, "height": height, "pixelRatio": 2.0, "mobile": true, "touch": true}});
        Self::start(width.max(500), height, Some(metrics)).await
    }

    /// Starts chromedriver and a headless Chromium with a window `width` × `height`, emulating
    /// `mobile` when given.
    async fn start(width: u32, height: u32, mobile: Option<serde_json::Value>) -> Browser {
        use std::os::unix::process::CommandExt;
        // A process group of its own: stopping it stops the browser it started too.
        let mut driver = Command::new("chromedriver")
            .arg("--port=0")
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (scripts/test installs Debian's chromium-driver)");
        let stdout = driver.stdout.take().expect("stdout");
        // It says "on port 0" first, then the port it took: "... started successfully on port N."
        let port = tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stdout).lines();
            let port = lines
                .by_ref()
                .map_while(Result::ok)
                .find_map(|line| {
                    line.contains("started successfully")
                        .then(|| {
                            line.rsplit("port ")
                                .next()?
                                .trim_end_matches('.')
                                .parse::<u16>()
                                .ok()
                        })
                        .flatten()
                })
                .expect("chromedriver says its port");
            // Keep reading, so chromedriver never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            port
        })
        .await
        .expect("join");
        let profile = tempfile::tempdir().expect("profile dir");
        let mut capabilities = json!({
            "goog:chromeOptions": {
                "binary": chromium(),
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--disable-gpu",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }
        });
        if let Some(mobile) = mobile {
            capabilities["goog:chromeOptions"]["mobileEmulation"] = mobile;
        }
        let capabilities = match capabilities {
            serde_json::Value::Object(map) => map,
            _ => unreachable!("an object"),
        };
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a browser session");
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    /// The element `css` selects (the page is in the panic when there is none).
    pub async fn element(&self, css: &str) -> fantoccini::elements::Element {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element,
            Err(e) => panic!("no {css} on the page ({e}): {}", self.page().await),
        }
    }

    /// The text of the element `css` selects.
    pub async fn text(&self, css: &str) -> String {
        self.element(css).await.text().await.expect("text")
    }

    /// The page's HTML, for a failure's message.
    pub async fn page(&self) -> String {
        let url = self
            .client
            .current_url()
            .await
            .map(|u| u.to_string())
            .unwrap_or_default();
        format!("{url}\n{}", self.client.source().await.unwrap_or_default())
    }

    /// Clicks the element `css` selects, and waits for the page it leads to (a form's answer
    /// or a link's target: a new document, loaded), as a person waits to see it. The old
    /// page is marked before the click, so a new one is told from it even at the same URL.
    pub async fn click(&self, css: &str) {
        let element = self.element(css).await;
        self.client
            .execute("window.__leaving = true;", vec![])
            .await
            .expect("mark the page");
        element.click().await.expect("click");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let arrived = self
                .client
                .execute(
                    "return window.__leaving === undefined && document.readyState === 'complete';",
                    vec![],
                )
                .await;
            if arrived.is_ok_and(|a| a == json!(true)) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "clicking {css} led nowhere: {}",
                self.page().await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Types `text` into the field `css` selects (emptied first).
    pub async fn fill(&self, css: &str, text: &str) {
        let field = self.element(css).await;
        field.clear().await.expect("clear");
        field.send_keys(text).await.expect("type");
    }

    /// The console session this browser holds: its cookie's value (HttpOnly: no page script
    /// can read it, WebDriver can).
    pub async fn session(&self) -> String {
        self.client
            .get_named_cookie("tollgate-console")
            .await
            .expect("a console session cookie")
            .value()
            .to_owned()
    }

    /// How many elements `css` selects.
    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .expect("find_all")
            .len()
    }

    /// Saves a screenshot of the window as `name`.png under the test run's screenshot
    /// directory (`target/tmp/console-screenshots`); returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let png = self.client.screenshot().await.expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    /// Whether the page fits the window's width (nothing scrolls sideways but the tables'
    /// own scroll boxes).
    pub async fn fits_width(&self) -> bool {
        let fits = self
            .client
            .execute(
                "return document.documentElement.scrollWidth <= window.innerWidth;",
                vec![],
            )
            .await
            .expect("script");
        fits == json!(true)
    }

    /// Ends the session, then stops chromedriver (and whatever it left running).
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.wait();
    }
}
