use super::*;

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // As the agent writes: a complete temporary file renamed over the old one.
    let tmp = path.with_file_name(format!(".{}.tmp", path.file_name().unwrap().to_str().unwrap()));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

fn pod(name: &str, ip: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: demo}}\nspec: {{containers: []}}\nstatus: {{podIP: {ip}}}\n")
}

/// The events as `verb Kind ns/name (file)`.
fn summary(events: &[(ObjectEvent, Origin)], root: &Path) -> Vec<String> {
    events
        .iter()
        .map(|(e, o)| {
            let verb = if matches!(e, ObjectEvent::Upsert(_)) { "upsert" } else { "delete" };
            format!("{verb} {} ({})", e.object_ref(), o.file.strip_prefix(root).unwrap().display())
        })
        .collect()
}

#[test]
fn files_become_events_and_diffs() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let mut src = DirSource::new(root);
    assert!(src.poll().is_empty(), "an empty directory");
    write(root, "Namespace/demo.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n");
    write(root, "Pod/demo/a.yaml", &pod("a", "10.244.1.2"));
    write(root, "multi.yml", &format!("{}---\n{}", pod("b", "10.244.1.3"), pod("c", "10.244.1.4")));
    write(root, "notes.txt", "not a manifest");
    write(root, "deploy.json", r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "skipped"}}"#);
    assert_eq!(
        summary(&src.poll(), root),
        [
            "upsert Namespace demo (Namespace/demo.yaml)",
            "upsert Pod demo/a (Pod/demo/a.yaml)",
            "upsert Pod demo/b (multi.yml)",
            "upsert Pod demo/c (multi.yml)"
        ]
    );
    assert!(src.poll().is_empty(), "nothing changed");
    // A changed file: only what differs.
    write(root, "multi.yml", &format!("{}---\n{}", pod("b", "10.244.1.3"), pod("d", "10.244.1.5")));
    assert_eq!(summary(&src.poll(), root), ["delete Pod demo/c (multi.yml)", "upsert Pod demo/d (multi.yml)"]);
    // The same content rewritten: no event.
    write(root, "Pod/demo/a.yaml", &pod("a", "10.244.1.2"));
    assert!(src.poll().is_empty());
    // A removed file deletes its objects.
    std::fs::remove_file(root.join("Pod/demo/a.yaml")).unwrap();
    assert_eq!(summary(&src.poll(), root), ["delete Pod demo/a (Pod/demo/a.yaml)"]);
    std::fs::remove_dir_all(root.join("Namespace")).unwrap();
    assert_eq!(summary(&src.poll(), root), ["delete Namespace demo (Namespace/demo.yaml)"]);
}

#[test]
fn a_broken_file_keeps_its_last_good_objects() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let mut src = DirSource::new(root);
    write(root, "a.yaml", &pod("a", "10.244.1.2"));
    assert_eq!(src.poll().len(), 1);
    // Not YAML, then an object that does not validate.
    write(root, "a.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a\n");
    assert!(src.poll().is_empty());
    assert!(src.errors()[&root.join("a.yaml")][0].message.contains("not valid YAML"));
    write(root, "a.yaml", &pod("a", "10.244.1.300"));
    assert!(src.poll().is_empty());
    assert_eq!(src.errors()[&root.join("a.yaml")][0].to_string(), "Pod demo/a: status.podIP: \"10.244.1.300\" is not an IP address");
    // Fixed: the change since the last good version.
    write(root, "a.yaml", &pod("a", "10.244.1.7"));
    let events = src.poll();
    assert_eq!(summary(&events, root), ["upsert Pod demo/a (a.yaml)"]);
    assert!(src.errors().is_empty());
    // A broken file that is removed still deletes its last good objects.
    write(root, "a.yaml", "kind: [");
    assert!(src.poll().is_empty());
    std::fs::remove_file(root.join("a.yaml")).unwrap();
    assert_eq!(summary(&src.poll(), root), ["delete Pod demo/a (a.yaml)"]);
    assert!(src.errors().is_empty());
}

#[test]
fn an_object_in_two_files_is_taken_from_the_first() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let mut src = DirSource::new(root);
    write(root, "a.yaml", &pod("p", "10.244.1.2"));
    assert_eq!(src.poll().len(), 1);
    write(root, "b.yaml", &pod("p", "10.244.1.3"));
    assert!(src.poll().is_empty(), "the copy is ignored");
    // The first file goes: the copy takes over.
    std::fs::remove_file(root.join("a.yaml")).unwrap();
    write(root, "c.yaml", &pod("q", "10.244.1.4"));
    assert_eq!(summary(&src.poll(), root), ["upsert Pod demo/p (b.yaml)", "upsert Pod demo/q (c.yaml)"]);
    // Moved to another file unchanged: nothing to say.
    std::fs::remove_file(root.join("b.yaml")).unwrap();
    write(root, "d.yaml", &pod("p", "10.244.1.3"));
    assert!(src.poll().is_empty());
    std::fs::remove_file(root.join("d.yaml")).unwrap();
    assert_eq!(summary(&src.poll(), root), ["delete Pod demo/p (d.yaml)"]);
}

#[test]
fn a_missing_directory_says_nothing_and_deletes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("not-yet");
    let mut src = DirSource::new(&root);
    assert!(src.poll().is_empty());
    write(&root, "a.json", r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}"#);
    assert_eq!(summary(&src.poll(), &root), ["upsert Namespace x (a.json)"]);
    // The whole directory goes: not "every object was deleted".
    std::fs::rename(&root, d.path().join("moved")).unwrap();
    assert!(src.poll().is_empty());
    assert!(src.poll().is_empty());
    // Back without a.json, with b.json: now the difference is known.
    write(&root, "b.json", r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "y"}}"#);
    let mut got = summary(&src.poll(), &root);
    got.sort();
    assert_eq!(got, ["delete Namespace x (a.json)", "upsert Namespace y (b.json)"]);
}

#[tokio::test]
async fn watch_sends_batches() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "a.yaml", &pod("a", "10.244.1.2"));
    let mut rx = DirSource::new(d.path()).watch(Duration::from_millis(10));
    let first = rx.recv().await.unwrap();
    assert_eq!(first.len(), 1);
    std::fs::remove_file(d.path().join("a.yaml")).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert!(matches!(next[0].0, ObjectEvent::Delete(_)));
}

/// The next batch, or a panic naming what was awaited.
async fn next_batch(rx: &mut tokio::sync::mpsc::Receiver<Vec<(ObjectEvent, Origin)>>, what: &str) -> Vec<(ObjectEvent, Origin)> {
    // Far below the poll interval of the watches below (60 s), far above
    // what a loaded machine needs: only a wake explains seeing it.
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Some(b)) => b,
        Ok(None) => panic!("the source stopped before {what}"),
        Err(_) => panic!("{what} was not seen within 5 s although the poll interval is 60 s: inotify did not wake the poll"),
    }
}

#[tokio::test]
async fn a_change_wakes_the_poll_long_before_the_interval() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().to_path_buf();
    write(&root, "Pod/demo/a.yaml", &pod("a", "10.244.1.2"));
    let mut rx = DirSource::new(&root).watch(Duration::from_secs(60));
    assert_eq!(next_batch(&mut rx, "the first poll").await.len(), 1);

    // A file replaced by rename in a directory that was there.
    write(&root, "Pod/demo/a.yaml", &pod("a", "10.244.1.3"));
    assert_eq!(summary(&next_batch(&mut rx, "a rewritten file").await, &root), ["upsert Pod demo/a (Pod/demo/a.yaml)"]);
    // Directories made after the first poll, two levels deep.
    write(&root, "Pod/other/deeper/b.yaml", &pod("b", "10.244.1.4"));
    assert_eq!(summary(&next_batch(&mut rx, "a file in a new directory").await, &root), ["upsert Pod demo/b (Pod/other/deeper/b.yaml)"]);
    // ... and watched from then on.
    write(&root, "Pod/other/deeper/c.yaml", &pod("c", "10.244.1.5"));
    assert_eq!(
        summary(&next_batch(&mut rx, "a second file in the new directory").await, &root),
        ["upsert Pod demo/c (Pod/other/deeper/c.yaml)"]
    );
    std::fs::remove_file(root.join("Pod/demo/a.yaml")).unwrap();
    assert_eq!(summary(&next_batch(&mut rx, "a removed file").await, &root), ["delete Pod demo/a (Pod/demo/a.yaml)"]);
    // A whole directory replaced by another one under the same name.
    std::fs::remove_dir_all(root.join("Pod/other")).unwrap();
    let batch = next_batch(&mut rx, "a removed directory").await;
    assert_eq!(summary(&batch, &root), ["delete Pod demo/b (Pod/other/deeper/b.yaml)", "delete Pod demo/c (Pod/other/deeper/c.yaml)"]);
    write(&root, "Pod/other/d.yaml", &pod("d", "10.244.1.6"));
    assert_eq!(summary(&next_batch(&mut rx, "a file in a re-created directory").await, &root), ["upsert Pod demo/d (Pod/other/d.yaml)"]);
}

#[test]
fn every_directory_listed_is_watched_and_only_those() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let mut src = DirSource::new(root);
    write(root, "Pod/a/x.yaml", &pod("x", "10.244.1.2"));
    write(root, "Pod/b/y.yaml", &pod("y", "10.244.1.3"));
    std::fs::create_dir_all(root.join(".hidden/z")).unwrap();
    src.poll();
    let watched = |src: &DirSource| src.wake.as_ref().expect("inotify on this machine").watched();
    // The root, Pod, Pod/a and Pod/b; hidden directories are not read.
    assert_eq!(watched(&src), 4);
    std::fs::remove_dir_all(root.join("Pod/b")).unwrap();
    assert!(src.wait(Duration::from_secs(60)), "the removal wakes the wait");
    assert_eq!(summary(&src.poll(), root), ["delete Pod demo/y (Pod/b/y.yaml)"]);
    assert_eq!(watched(&src), 3);
    // Nothing changed: the wait ends at its interval, not woken.
    assert!(!src.wait(Duration::from_millis(20)));
}

#[test]
fn a_woken_poll_lists_only_what_the_events_name_and_the_next_whole_listing_the_rest() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let mut src = DirSource::new(root);
    write(root, "Pod/a/x.yaml", &pod("x", "10.244.1.2"));
    write(root, "Pod/b/y.yaml", &pod("y", "10.244.1.3"));
    assert_eq!(src.poll().len(), 2);
    // A change in each directory; the events of b's are taken as lost:
    // the next poll lists a alone.
    write(root, "Pod/a/x.yaml", &pod("x", "10.244.1.4"));
    write(root, "Pod/b/y.yaml", &pod("y", "10.244.1.5"));
    std::fs::remove_file(root.join("Pod/b/y.yaml")).unwrap();
    write(root, "Pod/b/z.yaml", &pod("z", "10.244.1.6"));
    src.next = Scope::Dirs([(root.join("Pod/a"), false)].into());
    assert_eq!(summary(&src.poll(), root), ["upsert Pod demo/x (Pod/a/x.yaml)"], "b was not listed, so nothing there is gone");
    // The whole listing (every interval) finds the rest.
    assert_eq!(summary(&src.poll(), root), ["delete Pod demo/y (Pod/b/y.yaml)", "upsert Pod demo/z (Pod/b/z.yaml)"]);
    // A directory listed with its subdirectories.
    write(root, "Pod/b/c/w.yaml", &pod("w", "10.244.1.7"));
    std::fs::remove_file(root.join("Pod/b/z.yaml")).unwrap();
    src.next = Scope::Dirs([(root.join("Pod/b"), true)].into());
    assert_eq!(summary(&src.poll(), root), ["delete Pod demo/z (Pod/b/z.yaml)", "upsert Pod demo/w (Pod/b/c/w.yaml)"]);
    // A directory that is gone: its files are.
    std::fs::remove_dir_all(root.join("Pod/b")).unwrap();
    src.next = Scope::Dirs([(root.join("Pod/b"), true)].into());
    assert_eq!(summary(&src.poll(), root), ["delete Pod demo/w (Pod/b/c/w.yaml)"]);
    assert!(src.poll().is_empty());
}

#[test]
fn scopes_cover_their_directories_files() {
    let scope = Scope::Dirs([(PathBuf::from("/o/Pod/a"), false), (PathBuf::from("/o/Svc"), true)].into());
    assert!(scope.covers(Path::new("/o/Pod/a/x.yaml")));
    assert!(!scope.covers(Path::new("/o/Pod/a/sub/x.yaml")), "not recursive");
    assert!(!scope.covers(Path::new("/o/Pod/ab/x.yaml")));
    assert!(!scope.covers(Path::new("/o/Pod/x.yaml")));
    assert!(scope.covers(Path::new("/o/Svc/ns/deeper/x.yaml")));
    assert!(Scope::Everything.covers(Path::new("/anything")));
}

#[test]
fn a_wait_ends_at_the_interval_counted_from_the_last_whole_listing() {
    let d = tempfile::tempdir().unwrap();
    let mut src = DirSource::new(d.path());
    // Never listed: due at once.
    assert!(!src.wait(Duration::from_secs(3600)));
    src.poll();
    write(d.path(), "a.yaml", &pod("a", "10.244.1.2"));
    assert!(src.wait(Duration::from_secs(3600)), "woken by the write");
    assert_eq!(src.next, Scope::Dirs([(d.path().to_path_buf(), false)].into()));
    assert_eq!(src.poll().len(), 1);
    assert_eq!(src.next, Scope::Everything, "the wake's scope is used once");
}
